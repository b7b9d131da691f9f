"""The full service against `semjobs run`, on the same engine and prompts (issue #33).

The same N GSM8K questions (test lines from 1, cycling), greedy, --max-new-tokens tokens,
first through `semjobs run` (SQLite, its engine processes), then through `semjobs worker`
(its supervisor's one process per core, each a Celery node) fed by `semjobs submit` with a
scratch Postgres database and Redis queue. items/s of each = items / (last item finished -
first item started), read from its database. Engine start-up is left out of both: `run`'s
processes load before any item starts; the workers load on their first chunk, so a warm-up
job of 64 eight-token items goes first and the measured job is submitted once it is done.

    python benchmarks/service_vs_run.py --items 256 --out docs/benchmarks/service_vs_run.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, env_for, scratch_database, scratch_queue, write_json, write_prompts  # noqa: E402


def items_per_s(url: str, job_id: str | None = None) -> tuple[int, float]:
    from sqlalchemy import select

    from semjobs.db.models import Item
    from semjobs.db.repo import as_utc
    from semjobs.db.session import session_factory

    with session_factory(url)() as s:
        query = select(Item.started_at, Item.finished_at, Item.status)
        rows = s.execute(query.where(Item.job_id == job_id) if job_id else query).all()
    if not rows or any(r.status != "done" for r in rows):
        raise SystemExit(f"{url}: not every item is done")
    span = (max(as_utc(r.finished_at) for r in rows) - min(as_utc(r.started_at) for r in rows)).total_seconds()
    return len(rows), len(rows) / span


def job_status(url: str, job_id: str) -> str | None:
    from sqlalchemy import select

    from semjobs.db.models import Job
    from semjobs.db.session import session_factory

    with session_factory(url)() as s:
        return s.scalar(select(Job.status).where(Job.id == job_id))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    common = ["--max-new-tokens", str(a.max_new_tokens)]
    with tempfile.TemporaryDirectory() as tmp, scratch_database() as url, scratch_queue() as queue:
        path = write_prompts(Path(tmp) / "in.jsonl", a.items)
        env = env_for(url, queue)
        del env["SEMJOBS_ENGINE_FACTORY"]  # the real engine

        run_db = f"sqlite:///{tmp}/run.sqlite"
        subprocess.run([sys.executable, "-m", "semjobs.cli", "run", str(path), "-o", f"{tmp}/run.jsonl", "--db", run_db,
                        *common], env=env, cwd=ROOT, check=True, capture_output=True, text=True)
        run_items, run_rate = items_per_s(run_db)

        log = open(Path(tmp) / "worker.log", "w")
        worker = subprocess.Popen([sys.executable, "-m", "semjobs.cli", "worker", "-l", "WARNING"], env=env, cwd=ROOT,
                                  stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + a.timeout

        def submit_and_wait(inputs: Path, *options: str) -> str:
            out = subprocess.run([sys.executable, "-m", "semjobs.cli", "submit", str(inputs), *options], env=env, cwd=ROOT,
                                 check=True, capture_output=True, text=True)
            job_id = out.stdout.strip().splitlines()[-1]
            while True:
                # read here, not by `semjobs status` in a subprocess: starting Python every
                # poll took a large share of one of the two cores the workers decode on
                if job_status(url, job_id) == "completed":
                    return job_id
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"worker stopped or timed out:\n{(Path(tmp) / 'worker.log').read_text()[-3000:]}")
                time.sleep(2)

        try:
            submit_and_wait(write_prompts(Path(tmp) / "warm.jsonl", 64), "--max-new-tokens", "8")
            job_id = submit_and_wait(path, *common)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
        service_items, service_rate = items_per_s(url, job_id)
        write_json({
            "items": a.items, "max_new_tokens": a.max_new_tokens, "engine": "vllm",
            "run_items_per_s": round(run_rate, 3), "service_items_per_s": round(service_rate, 3),
            "service_over_run": round(service_rate / run_rate, 3),
            "items_done": {"run": run_items, "service": service_items},
        }, a.out)


if __name__ == "__main__":
    main()

"""Service overhead per item (queue + database) with an instant engine.

Submits N items (default 2,000) to a scratch Postgres database and a scratch Redis queue,
runs one real `semjobs worker` (solo pool) with the instant test-double engine, and reports:
- the median gap between consecutive item completions on that worker (what one item costs
  the service when the engine takes no time: Celery delivery amortised over the chunk,
  claim, result commit);
- mean per item = (last completion - first start) / N;
- median time from an item's claim to the write of its result (database only).
Not a timed test: run it by hand, e.g.
    python benchmarks/service_overhead.py --items 2000 --chunk-size 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, env_for, scratch_database, scratch_queue, write_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--chunk-size", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()

    from sqlalchemy import select

    from semjobs.db.models import Item, Job
    from semjobs.db.repo import as_utc
    from semjobs.db.session import session_factory

    with scratch_database() as url, scratch_queue() as queue, tempfile.TemporaryDirectory() as tmp:
        env = env_for(url, queue, SEMJOBS_CHUNK_SIZE=str(args.chunk_size))
        path = write_prompts(Path(tmp) / "in.jsonl", args.items)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "semjobs.cli", "submit", str(path)], env=env,
                             cwd=ROOT, capture_output=True, text=True, check=True)
        submit_s = time.perf_counter() - t0
        job_id = out.stdout.strip().splitlines()[-1]
        log = open(Path(tmp) / "worker.log", "w")
        worker = subprocess.Popen(
            [sys.executable, "-m", "semjobs.cli", "worker", "-l", "WARNING", "-n", f"bench-{queue}@%h"],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + args.timeout
            Session = session_factory(url)
            while True:
                with Session() as s:
                    status = s.scalar(select(Job.status).where(Job.id == job_id))
                if status == "completed":
                    break
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"worker stopped or timed out:\n"
                                     f"{(Path(tmp) / 'worker.log').read_text()[-3000:]}")
                time.sleep(0.5)
        finally:
            worker.terminate()
            worker.wait(timeout=30)
        with Session() as s:
            rows = s.execute(select(Item.started_at, Item.finished_at, Item.status)
                             .where(Item.job_id == job_id)).all()
        assert all(r.status == "done" for r in rows), "not every item is done"
        starts = sorted(as_utc(r.started_at) for r in rows)
        ends = sorted(as_utc(r.finished_at) for r in rows)
        gaps = [(b - a).total_seconds() * 1000 for a, b in zip(ends, ends[1:])]
        inner = sorted((as_utc(r.finished_at) - as_utc(r.started_at)).total_seconds() * 1000
                       for r in rows)
        span = (ends[-1] - starts[0]).total_seconds()
        result = {
            "items": len(rows),
            "chunk_size": args.chunk_size,
            "submit_s": round(submit_s, 2),
            "median_ms_per_item": round(statistics.median(gaps), 3),
            "p90_ms_per_item": round(statistics.quantiles(gaps, n=10)[-1], 3),
            "mean_ms_per_item": round(span * 1000 / len(rows), 3),
            "median_claim_to_save_ms": round(statistics.median(inner), 3),
            "items_per_s": round(len(rows) / span, 1),
        }
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

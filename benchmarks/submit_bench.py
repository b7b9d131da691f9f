"""`semjobs submit` of a large file: wall time and peak memory (targets: 50,000 lines in
<= 10 s, peak RSS <= 300 MB). Writes N GSM8K-question lines, submits them to a scratch
Postgres database and a scratch Redis queue in a child process, and reports the child's
wall time and peak RSS (ru_maxrss). Not a timed test; run e.g.
    python benchmarks/submit_bench.py --items 50000
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, env_for, scratch_database, scratch_queue, write_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=50_000)
    args = ap.parse_args()
    from sqlalchemy import func, select

    from semjobs.db.models import Item
    from semjobs.db.session import session_factory

    with scratch_database() as url, scratch_queue() as queue, tempfile.TemporaryDirectory() as tmp:
        path = write_prompts(Path(tmp) / "in.jsonl", args.items)
        env = env_for(url, queue)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "semjobs.cli", "submit", str(path)], env=env,
                              cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        with session_factory(url)() as s:
            n = s.scalar(select(func.count()).select_from(Item))
        import redis

        queued = redis.Redis.from_url(env["SEMJOBS_REDIS_URL"]).llen(queue)
        print(json.dumps({
            "items": args.items, "file_mb": round(path.stat().st_size / 1e6, 1),
            "wall_s": round(wall, 2), "peak_rss_mb": round(peak_kb / 1024, 1),
            "item_rows": n, "messages_queued": queued,
            "submit_output": proc.stdout.strip().splitlines()[0],
        }, indent=2))


if __name__ == "__main__":
    main()

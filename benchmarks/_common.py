"""Helpers shared by the benchmarks: a throw-away Postgres database, a unique queue, the
environment for `semjobs` subprocesses, and writing a result as JSON."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid
from pathlib import Path

from semspec.assets import GSM8K_TEST

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get(
    "SEMJOBS_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("SEMJOBS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
GSM8K = Path(os.environ.get("SEMJOBS_GSM8K", GSM8K_TEST))
FAKE_ENGINE = "tests.fake_engine:InstantEngine.load"  # the instant test double


@contextlib.contextmanager
def scratch_database():
    from sqlalchemy import create_engine, text

    sys.path.insert(0, str(ROOT))
    from semjobs.db import migrate

    name = f"sjbench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = f"{PG_ADMIN_URL.rpartition('/')[0]}/{name}"
    try:
        migrate.upgrade(url)
        yield url
    finally:
        from semjobs.db.session import forget

        forget(url)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextlib.contextmanager
def scratch_queue():
    import redis

    name = f"sjbench-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        r = redis.Redis.from_url(REDIS_URL)
        for key in r.scan_iter(f"*{name}*"):
            r.delete(key)


def env_for(db_url: str, queue: str, **extra: str) -> dict:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        SEMJOBS_DATABASE_URL=db_url,
        SEMJOBS_REDIS_URL=REDIS_URL,
        SEMJOBS_QUEUE=queue,
        SEMJOBS_ENGINE_FACTORY=FAKE_ENGINE,
        **extra,
    )
    return env


def write_prompts(path: Path, n: int) -> Path:
    """n plain lines cycling through the GSM8K questions (ids unique)."""
    questions = [json.loads(line)["question"] for line in open(GSM8K)] if GSM8K.exists() else [
        "Janet has 3 apples and buys 5 more. How many apples does she have?"
    ]
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i:06d}", "prompt": questions[i % len(questions)]}) + "\n")
    return path


def write_json(result: dict, out: Path | None) -> None:
    """Print ``result`` as JSON, and write it to ``out`` (parents created) when given."""
    text = json.dumps(result, indent=1)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)

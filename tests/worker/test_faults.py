"""Faults a long job meets, injected for real: the broker and the database restarted under a
running job, the whole stack stopped and started again, a chunk that outlives the broker's
visibility timeout, an item that kills its worker every time. Real `semjobs worker`
subprocesses (batching on), private Redis and Postgres servers that the test stops and
starts (tests/services.py). Each test counts what matters: every input has exactly one
output, and no finished item is generated again. The restarts run on the instant test
double and on vLLM (the `decoding` fixture); the visibility-timeout and poison-item tests
on the double alone: they need items of a set length, and an item that kills its process."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from sqlalchemy import func, select

from semjobs.db import migrate
from semjobs.db.models import Item, Job, Output
from semjobs.db.session import forget, session_factory
from tests.conftest import FAKE_ENGINE, FIRST_PROGRESS_S, ROOT, Workers, wait_for
from tests.services import PrivatePostgres, PrivateRedis
from tests.worker.test_celery_e2e import counts, decoded_by, submit, wait_completed, write_input

pytestmark = pytest.mark.slow


@pytest.fixture
def private_redis():
    server = PrivateRedis()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_pg():
    server = PrivatePostgres()
    server.start()
    migrate.upgrade(server.url)
    yield server
    forget(server.url)
    server.remove()


@pytest.fixture
def stack(private_redis, private_pg, last_run_file, tmp_path):
    """Workers and commands on the private servers: slow items in batches of 2 (chunks of 4
    wait in the queue), beats every 0.5 s, a worker silent for 2 s is dead."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        SEMJOBS_DATABASE_URL=private_pg.url, SEMJOBS_REDIS_URL=private_redis.url,
        SEMJOBS_QUEUE="faults", SEMJOBS_ENGINE_FACTORY=FAKE_ENGINE, SEMJOBS_CHUNK_SIZE="4",
        SEMJOBS_LAST_RUN_FILE=str(last_run_file), FAKE_ENGINE_DELAY_S="0.4",
        SEMJOBS_BATCH_SIZE="2", SEMJOBS_HEARTBEAT_INTERVAL_S="0.5", SEMJOBS_WORKER_DEAD_AFTER_S="2",
        SEMJOBS_PROCESSES="1",  # one Celery node per `semjobs worker`, which the faults kill
    )
    w = Workers(env, tmp_path)
    w.redis, w.pg, w.url, w.tmp = private_redis, private_pg, private_pg.url, tmp_path
    yield w
    w.stop_all()


def on_engine(stack, decoding) -> tuple:
    """Point the stack's workers at the `decoding` fixture's engine; the submit options for it."""
    engine_env, options = decoding
    stack.env = {**stack.env, **engine_env}
    return options


def items(url, job_id) -> dict[int, Item]:
    with session_factory(url)() as s:
        return {i.seq: i for i in s.scalars(select(Item).where(Item.job_id == job_id))}


def n_outputs(url, job_id) -> int:
    with session_factory(url)() as s:
        return s.scalar(select(func.count()).select_from(Output).where(Output.job_id == job_id))


def done(url, job_id) -> int:
    return counts(url, job_id).get("done", 0)


def test_redis_restarted_mid_job_the_lost_messages_are_reissued(stack, decoding):
    """A Redis that keeps nothing on disk restarts: its queued chunks are gone. The worker
    reconnects, its heartbeat finds the pending items no worker holds and no message carries,
    enqueues them again, and the job completes with every item generated once."""
    options = on_engine(stack, decoding)
    n = 16
    job_id = submit(stack.env, write_input(stack.tmp / "in.jsonl", n), *options)
    w = stack.start("w1")
    wait_for(lambda: done(stack.url, job_id) >= 1, FIRST_PROGRESS_S, interval=0.05, what="first items")
    stack.redis.stop()
    stack.redis.start()
    wait_completed(stack.url, job_id, stack)
    assert "had lost the messages of pending items" in stack.log(w)
    assert n_outputs(stack.url, job_id) == n and decoded_by(stack.url, job_id, decoding)
    # the chunks in the worker's hands when Redis went down finished there; each item of a
    # lost chunk counts the lost delivery and its run
    assert all(i.status == "done" and i.attempts in (1, 2) for i in items(stack.url, job_id).values())


def test_postgres_restarted_mid_job_commits_are_retried(stack, decoding):
    """Postgres stops for two seconds under a running job: the items in flight keep their
    results, the worker retries its commits with back-off (one warning, no traceback per
    attempt), and nothing is lost or generated twice."""
    options = on_engine(stack, decoding)
    n = 12
    job_id = submit(stack.env, write_input(stack.tmp / "in.jsonl", n), *options)
    w = stack.start("w1")
    wait_for(lambda: done(stack.url, job_id) >= 2, FIRST_PROGRESS_S, interval=0.05, what="first items")
    stack.pg.stop()
    time.sleep(2)
    stack.pg.start()
    wait_completed(stack.url, job_id, stack)
    log = stack.log(w)
    assert "database unreachable" in log and "Traceback" not in log, log[-3000:]
    assert n_outputs(stack.url, job_id) == n and decoded_by(stack.url, job_id, decoding)
    assert [i.attempts for i in items(stack.url, job_id).values()] == [1] * n


def test_everything_stopped_then_started_again_continues_without_redoing(stack, decoding):
    """Worker (SIGTERM), Redis and Postgres all stopped mid-job, then started again: the new
    worker finishes the job, no finished item is redone, every item has one output."""
    options = on_engine(stack, decoding)
    n = 16
    job_id = submit(stack.env, write_input(stack.tmp / "in.jsonl", n), *options)
    first = stack.start("first")
    wait_for(lambda: done(stack.url, job_id) >= 3, FIRST_PROGRESS_S, interval=0.05, what="first items")
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=30)
    before = {seq: i.finished_at for seq, i in items(stack.url, job_id).items() if i.status == "done"}
    assert 3 <= len(before) < n
    forget(stack.url)
    stack.redis.stop()
    stack.pg.stop()
    stack.pg.start()
    stack.redis.start()
    stack.start("second")
    wait_completed(stack.url, job_id, stack)
    after = items(stack.url, job_id)
    assert n_outputs(stack.url, job_id) == n and decoded_by(stack.url, job_id, decoding)
    assert all(after[seq].finished_at == at for seq, at in before.items())


def test_a_chunk_that_outlives_the_visibility_timeout_generates_no_item_twice(stack):
    """A chunk running longer than the broker's visibility timeout: Redis hands it to a second
    worker while the first still decodes it. The second skips what a live worker is running;
    every item is generated once. The first's items are held running (the fake engine's gate)
    until the second has been handed the chunk, however long the second takes to start."""
    vt = 2
    gate = stack.tmp / "gate"
    env = {**stack.env, "SEMJOBS_VISIBILITY_TIMEOUT_S": str(vt), "FAKE_ENGINE_DELAY_S": "0",
           "FAKE_ENGINE_GATE": str(gate), "SEMJOBS_CHUNK_SIZE": "2", "SEMJOBS_BATCH_SIZE": "2"}
    stack.env = env
    n = 2  # one chunk
    job_id = submit(env, write_input(stack.tmp / "in.jsonl", n))
    stack.start("first")
    wait_for(lambda: counts(stack.url, job_id).get("running", 0) == n, FIRST_PROGRESS_S, interval=0.05,
             what="the chunk running")
    second = stack.start("second")
    skipped = re.compile(r"chunk \[\d+\]: done=0 failed=0 skipped=2")
    wait_for(lambda: skipped.search(stack.log(second)), FIRST_PROGRESS_S, what="the second worker handed the chunk")
    gate.touch()
    wait_completed(stack.url, job_id, stack)
    assert n_outputs(stack.url, job_id) == n
    got = items(stack.url, job_id)
    assert [i.attempts for i in got.values()] == [1] * n, {s: (i.attempts, i.worker) for s, i in got.items()}
    assert len({i.worker for i in got.values()}) == 1  # the first's: the second decoded none (done=0)


def test_an_item_that_kills_its_worker_every_time_fails_after_the_attempt_cap(stack):
    """A poison item SIGKILLs the process decoding it, every time: after the attempt cap it is
    failed with a reason, and the rest of the job completes."""
    env = {**stack.env, "SEMJOBS_MAX_ATTEMPTS": "2", "FAKE_ENGINE_DELAY_S": "0.1",
           "SEMJOBS_BATCH_SIZE": "1"}
    stack.env = env
    n = 8
    path = write_input(stack.tmp / "in.jsonl", n, kill={5})
    job_id = submit(env, path)
    stack.start("pf", "--pool", "prefork", "--concurrency", "1")
    wait_for(lambda: not {"pending", "running"} & counts(stack.url, job_id).keys(), 120,
             what="every item settled")
    got = items(stack.url, job_id)
    assert got[5].status == "failed" and "gave up after 2 deliveries" in got[5].error
    assert all(i.status == "done" for seq, i in got.items() if seq != 5)
    with session_factory(stack.url)() as s:
        assert s.get(Job, job_id).status == "completed"
    assert n_outputs(stack.url, job_id) == n - 1

"""The orphan scan (`semjobs.worker.orphans`) on real Postgres and Redis: a job stored but never
enqueued (its submit died between the commit and the enqueue, or met a broker that was down)
is enqueued by the scan once it has been seen so for the grace period, exactly once, and
without counting a delivery."""

from __future__ import annotations

import base64
import json

import pytest
from sqlalchemy import select

from semjobs.db.models import Item, Job
from semjobs.db.session import session_factory
from semjobs.jobs.submit import job_config, store_job
from semjobs.settings import Settings, settings
from semjobs.worker.orphans import LostChunks, requeue_lost


@pytest.fixture
def broker(redis_url, monkeypatch):
    """The real publisher, onto this test's Redis; a client to read it with."""
    import redis

    from semjobs.worker import celery, publish

    app = celery.make_app(Settings(redis_url=redis_url))
    monkeypatch.setattr(publish, "app", app)
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def stored_not_enqueued(url, queue, tmp_path, n):
    """What a submit leaves that dies between its commit and its enqueue: the job's rows,
    pending, and no message."""
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"question {i}"}) + "\n" for i in range(n)))
    job_id, _ = store_job(p, job_config("ar", 16), queue=queue, url=url, status="pending")
    return job_id


def messages(client, queue):
    """The (job id, positions) of each chunk message waiting in `queue`."""
    return sorted(json.loads(base64.b64decode(json.loads(m)["body"]))[0] for m in client.lrange(queue, 0, -1))


def job_and_attempts(url, job_id):
    with session_factory(url)() as s:
        return s.get(Job, job_id).status, set(s.scalars(select(Item.attempts).where(Item.job_id == job_id)))


def test_a_job_stored_but_never_enqueued_is_enqueued_once(pg_db, queue, broker, tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "pending_grace_s", 0)
    job_id = stored_not_enqueued(pg_db, queue, tmp_path, n=6)
    scan = LostChunks()
    assert requeue_lost(scan, pg_db, broker) == {}  # seen once: maybe a message in transit
    assert requeue_lost(scan, pg_db, broker) == {job_id: [0, 1, 2, 3, 4, 5]}
    assert messages(broker, queue) == [[job_id, [0, 1, 2, 3]], [job_id, [4, 5]]]
    assert job_and_attempts(pg_db, job_id) == ("queued", {0})  # nothing was delivered before
    for _ in range(2):  # its messages wait in the queue: nothing is lost
        assert requeue_lost(scan, pg_db, broker) == {}
    assert len(messages(broker, queue)) == 2


def test_a_submit_still_enqueueing_is_not_raced(pg_db, queue, broker, tmp_path, monkeypatch):
    """Within the grace period a pending job may be its submit's, publishing right now."""
    monkeypatch.setattr(settings, "pending_grace_s", 60)
    job_id = stored_not_enqueued(pg_db, queue, tmp_path, n=2)
    scan = LostChunks()
    for _ in range(3):
        assert requeue_lost(scan, pg_db, broker) == {}
    assert messages(broker, queue) == [] and job_and_attempts(pg_db, job_id) == ("pending", {0})
    scan.unsent_since[job_id] -= 61  # seen so for longer than the grace period
    assert requeue_lost(scan, pg_db, broker) == {job_id: [0, 1]}
    assert messages(broker, queue) == [[job_id, [0, 1]]]


def test_a_submit_that_meets_a_broker_down_is_enqueued_by_the_scan(pg_db, queue, broker, tmp_path, monkeypatch):
    """`semjobs submit` and the scan agree: the submit stores the job, cannot publish, exits 1
    saying a worker will enqueue it; once the broker answers, a worker's scan does."""
    from click.testing import CliRunner

    from semjobs.cli.main import main
    from semjobs.worker import celery, publish

    monkeypatch.setattr(settings, "database_url", pg_db)
    monkeypatch.setattr(settings, "queue", queue)
    monkeypatch.setattr(settings, "check_prompt_lengths", False)
    monkeypatch.setattr(settings, "pending_grace_s", 0)
    answering = publish.app
    monkeypatch.setattr(publish, "app", celery.make_app(Settings(redis_url="redis://127.0.0.1:1/0")))
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"question {i}"}) + "\n" for i in range(3)))
    res = CliRunner().invoke(main, ["submit", str(p)])
    assert res.exit_code == 1 and "stored but not enqueued" in res.output, res.output
    assert "a running worker enqueues it once the broker answers" in res.output
    job_id = res.output.split("error: job ")[1].split()[0]
    assert job_and_attempts(pg_db, job_id) == ("pending", {0})

    monkeypatch.setattr(publish, "app", answering)  # the broker is back
    scan = LostChunks()
    requeue_lost(scan, pg_db, broker)
    assert requeue_lost(scan, pg_db, broker) == {job_id: [0, 1, 2]}
    assert messages(broker, queue) == [[job_id, [0, 1, 2]]]

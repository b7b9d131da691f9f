"""The reaper (`semjobs.worker.recovery.recover`) on real Postgres: the items a dead worker held are
released and enqueued exactly once, however many reapers run at the same time; live
workers' items are left alone; the attempt cap still counts; the late redelivery of the
dead worker's chunk stores nothing twice."""

import threading
import time
from contextlib import contextmanager

import pytest
from sqlalchemy import func, select, text

from semjobs.db import repo
from semjobs.db.models import Item, Output, Worker
from semjobs.db.session import session_factory
from tests.worker.test_process import make_job
from semjobs.worker.process import run_items
from semjobs.worker.recovery import recover

DEAD, LIVE = "dead@h:1", "live@h:2"


def sql(url, statement, **params):
    with session_factory(url)() as s:
        s.execute(text(statement), params)
        s.commit()


def items(url, job_id):
    with session_factory(url)() as s:
        return {i.seq: i for i in s.scalars(select(Item).where(Item.job_id == job_id))}


def worker_names(url):
    with session_factory(url)() as s:
        return set(s.scalars(select(Worker.name)))


@pytest.fixture
def crashed(pg_db, tmp_path):
    """A job of 8 items: DEAD (silent for an hour) had finished 0, was running 1 and held 2, 3
    in its chunk; LIVE is running 4 and holds 5; 6 and 7 wait in the queue, unheld."""
    job_id = make_job(pg_db, tmp_path, n=8)
    with session_factory(pg_db)() as s:
        repo.beat(s, DEAD)
        repo.beat(s, LIVE)
    sql(pg_db, "UPDATE workers SET heartbeat_at = now() - interval '1 hour' WHERE name = :w", w=DEAD)
    for seq, status, worker, attempts in [(0, "done", DEAD, 1), (1, "running", DEAD, 1),
                                          (2, "pending", DEAD, 0), (3, "pending", DEAD, 0),
                                          (4, "running", LIVE, 1), (5, "pending", LIVE, 0)]:
        sql(pg_db, "UPDATE items SET status = :st, worker = :w, attempts = :a "
            "WHERE job_id = :j AND seq = :seq", st=status, w=worker, a=attempts, j=job_id, seq=seq)
    return job_id


def recording_publisher(sent, delay_s=0.0):
    """Stands in for `semjobs.worker.publish.publisher`: records (queue, job, seqs) per message."""
    lock = threading.Lock()

    @contextmanager
    def publisher(queue):
        def send(job_id, seqs, labels=None):
            time.sleep(delay_s)  # keeps the reaper's transaction open while others try
            with lock:
                sent.append((queue, job_id, list(seqs)))

        yield send

    return publisher


def test_concurrent_reapers_enqueue_a_dead_workers_items_exactly_once(pg_db, crashed):
    sent, results, errors = [], [], []
    n = 6
    barrier = threading.Barrier(n)
    publisher = recording_publisher(sent, delay_s=0.3)

    def reaper():
        try:
            barrier.wait()
            results.append(recover(pg_db, publisher=publisher))
        except Exception as e:  # noqa: BLE001  (re-raised below, in the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=reaper) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    winners = [r for r in results if r.workers]
    assert len(results) == n and len(winners) == 1
    assert winners[0].workers == [DEAD] and winners[0].items == {crashed: [1, 2, 3]}
    # chunk_size 4: one message with the three items, on the job's queue
    assert sent == [("q", crashed, [1, 2, 3])]

    rows = items(pg_db, crashed)
    assert [(rows[s].status, rows[s].worker) for s in (1, 2, 3)] == [("pending", None)] * 3
    assert rows[1].attempts == 1, "the dead worker's attempt still counts towards the cap"
    assert (rows[0].status, rows[4].status, rows[4].worker) == ("done", "running", LIVE)
    assert (rows[5].status, rows[5].worker) == ("pending", LIVE)
    assert rows[6].worker is None and rows[7].worker is None
    assert worker_names(pg_db) == {LIVE}
    assert recover(pg_db, publisher=publisher).workers == []


def test_a_reaper_skips_a_dead_worker_another_reaper_is_releasing(pg_db, crashed):
    sent = []
    with session_factory(pg_db)() as first:
        held = repo.release_dead_workers(first, 60)  # row locks held, not committed yet
        assert held.items == {crashed: [1, 2, 3]}
        t0 = time.monotonic()
        assert recover(pg_db, publisher=recording_publisher(sent)).workers == []
        assert time.monotonic() - t0 < 5, "SKIP LOCKED: the second reaper must not wait"
        first.commit()
    assert recover(pg_db, publisher=recording_publisher(sent)).workers == []
    assert sent == []


def test_a_failed_publish_leaves_the_items_held_for_the_next_pass(pg_db, crashed):
    @contextmanager
    def broken(queue):
        raise ConnectionError("broker down")
        yield  # pragma: no cover

    with pytest.raises(ConnectionError):
        recover(pg_db, publisher=broken)
    assert items(pg_db, crashed)[1].worker == DEAD and DEAD in worker_names(pg_db)
    sent = []
    assert recover(pg_db, publisher=recording_publisher(sent)).items == {crashed: [1, 2, 3]}
    assert sent == [("q", crashed, [1, 2, 3])]


def test_fresh_heartbeats_are_not_reaped(pg_db, crashed):
    sql(pg_db, "UPDATE workers SET heartbeat_at = now() - interval '30 seconds'")
    assert recover(pg_db, dead_after_s=45, publisher=recording_publisher([])).workers == []
    assert recover(pg_db, dead_after_s=20, publisher=recording_publisher([])).workers == [DEAD,
                                                                                           LIVE]


def test_recovered_items_run_once_and_the_late_redelivery_stores_nothing(pg_db, crashed,
                                                                          fake_engine):
    recover(pg_db, publisher=recording_publisher([]))
    rep = run_items(crashed, [1, 2, 3], url=pg_db, worker="survivor@h:3")
    assert rep.done == 3
    before = {s: (i.status, i.attempts, i.worker) for s, i in items(pg_db, crashed).items()}
    assert before[1] == ("done", 2, "survivor@h:3") and before[2] == ("done", 1, "survivor@h:3")

    # the dead worker's own chunk, redelivered by Redis after the visibility timeout
    late = run_items(crashed, [0, 1, 2, 3], url=pg_db, worker="survivor@h:3")
    assert (late.done, late.skipped, late.duplicates) == (0, 4, 0)
    assert {s: (i.status, i.attempts, i.worker) for s, i in items(pg_db, crashed).items()} == before
    with session_factory(pg_db)() as s:
        n_out = s.scalar(select(func.count()).select_from(Output).where(Output.job_id == crashed))
    assert n_out == 3  # one per recovered item (item 0's "done" is the fixture's, no output)


def test_attempt_cap_counts_the_dead_workers_attempts(pg_db, crashed, fake_engine):
    from semjobs.settings import settings

    sql(pg_db, "UPDATE items SET attempts = :a WHERE job_id = :j AND seq = 1",
        a=settings.max_attempts, j=crashed)
    recover(pg_db, publisher=recording_publisher([]))
    rep = run_items(crashed, [1], url=pg_db, worker="survivor@h:3")
    assert rep.failed == 1
    assert "gave up" in items(pg_db, crashed)[1].error


def test_a_chunk_holds_its_items_and_drops_the_hold_on_what_it_hands_back(pg_db, tmp_path,
                                                                           fake_engine):
    job_id = make_job(pg_db, tmp_path, n=4)
    seen = []

    def stop_after_one():
        seen.append({s: i.worker for s, i in items(pg_db, job_id).items()})
        return True

    rep = run_items(job_id, [0, 1, 2, 3], url=pg_db, worker="w@h:1", should_stop=stop_after_one)
    assert rep.done == 1 and rep.left == [1, 2, 3]
    assert seen[0] == {0: "w@h:1", 1: "w@h:1", 2: "w@h:1", 3: "w@h:1"}  # all held while running
    rows = items(pg_db, job_id)
    assert rows[0].worker == "w@h:1"
    assert [rows[s].worker for s in (1, 2, 3)] == [None] * 3  # requeued by the task itself


def test_beat_creates_then_refreshes_the_row_on_the_database_clock(pg_db):
    with session_factory(pg_db)() as s:
        repo.beat(s, "w@h:1")
        first = s.get(Worker, "w@h:1")
        started, beat = first.started_at, first.heartbeat_at
        time.sleep(0.05)
        repo.beat(s, "w@h:1")
        s.expire_all()
        again = s.get(Worker, "w@h:1")
        assert again.started_at == started and again.heartbeat_at > beat
        assert s.scalar(select(func.now() - Worker.heartbeat_at)).total_seconds() < 5


def test_semjobs_recover_publishes_to_the_jobs_queue(service_env, pg_db, redis_url, queue,
                                                      tmp_path):
    """The operator's command, against real Postgres and Redis."""
    import base64
    import json

    import redis

    from tests.conftest import run_cli
    from tests.worker.test_celery_e2e import submit, write_input

    job_id = submit(service_env, write_input(tmp_path / "in.jsonl", 8))  # 2 chunk messages
    assert "no worker silent" in run_cli(["recover"], service_env).stdout
    with session_factory(pg_db)() as s:
        repo.beat(s, DEAD)
    sql(pg_db, "UPDATE workers SET heartbeat_at = now() - interval '1 hour'")
    sql(pg_db, "UPDATE items SET status = 'running', worker = :w, attempts = 1 "
        "WHERE job_id = :j AND seq = 5", w=DEAD, j=job_id)
    sql(pg_db, "UPDATE items SET worker = :w WHERE job_id = :j AND seq IN (6, 7)", w=DEAD, j=job_id)

    out = run_cli(["recover"], service_env).stdout
    assert f"dead workers: {DEAD}" in out and f"job {job_id}: re-enqueued 3 items" in out
    messages = redis.Redis.from_url(redis_url).lrange(queue, 0, -1)
    args = [json.loads(base64.b64decode(json.loads(m)["body"]))[0] for m in messages]
    assert sorted(args) == [[job_id, [0, 1, 2, 3]], [job_id, [4, 5, 6, 7]], [job_id, [5, 6, 7]]]


def test_a_redelivery_leaves_an_item_a_live_worker_runs_and_takes_a_dead_ones(pg_db, crashed):
    """A chunk handed out again (it outlived the visibility timeout) claims what a dead
    worker was running, never what a live one still runs; pending items stay claimable."""
    with session_factory(pg_db)() as s:
        assert repo.claim_item(s, crashed, 4, "other@h:3", dead_after_s=45) is None
        assert repo.claim_item(s, crashed, 4, LIVE, dead_after_s=45) is not None  # its own retry
        assert repo.claim_item(s, crashed, 1, "other@h:3", dead_after_s=45).attempts == 2
        assert repo.claim_item(s, crashed, 5, "other@h:3", dead_after_s=45) is not None


def test_a_sibling_whose_process_is_gone_is_reaped_at_once(pg_db, crashed):
    """Prefork children of one node share a host: a child killed mid-item is dead as soon as
    its process is gone, though its heartbeat is fresh; other nodes wait for theirs to age."""
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    gone, alive = f"live@h:{child.pid}", "live@h:1"  # pid 1 always runs
    with session_factory(pg_db)() as s:
        repo.beat(s, gone)
        repo.beat(s, alive)
    sql(pg_db, "UPDATE items SET worker = :w WHERE job_id = :j AND seq = 4", w=gone, j=crashed)
    sent = []
    released = recover(pg_db, 45, recording_publisher(sent), me=alive)
    assert gone in released.workers and alive not in released.workers and LIVE not in released.workers
    assert released.items[crashed] == [1, 2, 3, 4]
    assert worker_names(pg_db) == {LIVE, alive}


def test_a_worker_hands_back_what_it_holds_but_no_longer_works_on(pg_db, crashed):
    """LIVE beats, so no reaper takes its items; its own heartbeat releases those its
    process does not work on (a chunk that ended unsettled, a predecessor of the same name)
    and enqueues them; what it works on stays."""
    from semjobs.worker.recovery import hand_back_unworked

    sent = []
    released = hand_back_unworked(LIVE, lambda: {(crashed, 5)}, pg_db, recording_publisher(sent))
    assert released == {crashed: [4]} and [s[1:] for s in sent] == [(crashed, [4])]
    got = items(pg_db, crashed)
    assert (got[4].status, got[4].worker, got[4].attempts) == ("pending", None, 1)
    assert got[5].worker == LIVE
    assert hand_back_unworked(LIVE, lambda: {(crashed, 5)}, pg_db, recording_publisher(sent)) == {}


def test_liveness_works_on_sqlite_too(sqlite_db, tmp_path):
    """SQLite has no interval arithmetic: the cutoff comes from its own datetime()."""
    with session_factory(sqlite_db)() as s:
        repo.beat(s, LIVE)
        repo.beat(s, DEAD)
    sql(sqlite_db, "UPDATE workers SET heartbeat_at = datetime('now', '-1 hour') WHERE name = :w", w=DEAD)
    with session_factory(sqlite_db)() as s:
        assert repo.live_workers(s, 45) == 1
        assert repo.release_dead_workers(s, 45).workers == [DEAD]


def test_the_calibration_questions_of_a_dead_worker_go_back_out(pg_db, crashed):
    """A whole worker killed mid-question: the reaper makes the question pending again and
    sends it to its calibration's queue, as it does the items."""
    from semjobs.jobs import calibration as cal
    from semspec.calibration.collect import CollectConfig

    cal_id = cal.create([("q1", "What is 2+2?"), ("q2", "And 3+3?")], CollectConfig(samples=2), "calq", url=pg_db)
    sql(pg_db, "UPDATE calibration_questions SET status = 'running', worker = :w, attempts = 1 "
        "WHERE calibration_id = :c AND question_id = 'q1'", w=DEAD, c=cal_id)
    sent, questions = [], []

    @contextmanager
    def question_publisher(queue):
        yield lambda c, q: questions.append((queue, c, q))

    released = recover(pg_db, 45, recording_publisher(sent), question_publisher=question_publisher)
    assert released.questions == {cal_id: ["q1"]} and questions == [("calq", cal_id, "q1")]
    assert cal.counts(cal_id, url=pg_db)["pending"] == 2

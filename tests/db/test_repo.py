"""The writes that settle an item (`semjobs.db.repo`) are guarded by the state they expect, on
Postgres and on SQLite: a result that comes late (after a cancel, after a failure) stores
nothing and changes nothing, a worker's failure settles only an item it still holds, a worker
that cannot serve a chunk fails only its items no worker holds, and a retry never undoes a
cancel."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select, text, update

from semjobs.db import repo
from semjobs.db.models import Item, ItemStats, Job, Output, StepLog
from semjobs.db.session import session_factory
from semspec.types import GenerationConfig
from tests.conftest import wait_for
from tests.fake_engine import InstantEngine
from tests.worker.test_process import make_job, statuses

W1, W2 = "w1@h:1", "w2@h:2"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request):
    return request.getfixturevalue("sqlite_db" if request.param == "sqlite" else "pg_db")


def a_result():
    return InstantEngine().generate("a late prompt", GenerationConfig(max_new_tokens=8))


def item(url, pk):
    with session_factory(url)() as s:
        return s.get(Item, pk)


def rows_of(url, pk):
    """How many outputs, step-log and stats rows item `pk` has."""
    with session_factory(url)() as s:
        return tuple(s.scalar(select(func.count()).select_from(model).where(model.item_pk == pk))
                     for model in (Output, StepLog, ItemStats))


def test_a_late_result_leaves_a_cancelled_item_cancelled(db_url, tmp_path):
    job_id = make_job(db_url, tmp_path, n=2)
    with session_factory(db_url)() as s:
        running = repo.claim_item(s, job_id, 0, W1)
        repo.cancel_job(s, job_id)
        assert repo.cancel_running(s, running.pk, W1)  # the worker aborts its decode
        assert repo.save_result(s, job_id, running.pk, a_result()) is False
        assert s.get(Job, job_id).status == "cancelled"
    assert item(db_url, running.pk).status == "cancelled"
    assert rows_of(db_url, running.pk) == (0, 0, 0)


def test_a_late_result_leaves_a_failed_item_failed(db_url, tmp_path):
    job_id = make_job(db_url, tmp_path, n=2)
    with session_factory(db_url)() as s:
        running = repo.claim_item(s, job_id, 0, W1)
        assert repo.fail_item(s, running.pk, "no progress for 600 s", W1)
        assert repo.save_result(s, job_id, running.pk, a_result()) is False
    got = item(db_url, running.pk)
    assert (got.status, got.error) == ("failed", "no progress for 600 s")
    assert rows_of(db_url, running.pk) == (0, 0, 0)


def test_a_result_is_stored_once_while_the_item_runs(db_url, tmp_path):
    """Any delivery's result counts, the first to come is stored; the second stores nothing."""
    job_id = make_job(db_url, tmp_path, n=1)
    with session_factory(db_url)() as s:
        first = repo.claim_item(s, job_id, 0, W1)
        repo.claim_item(s, job_id, 0, W2)  # handed out again while W1 still decodes it
        assert repo.save_result(s, job_id, first.pk, a_result()) is True
        assert repo.save_result(s, job_id, first.pk, a_result()) is False
    assert item(db_url, first.pk).status == "done"
    assert rows_of(db_url, first.pk) == (1, 2, 1)


def test_a_late_failure_does_not_settle_an_item_another_worker_now_runs(db_url, tmp_path):
    job_id = make_job(db_url, tmp_path, n=1)
    with session_factory(db_url)() as s:
        claim = repo.claim_item(s, job_id, 0, W1)
        repo.release_held(s, W1, [(job_id, 0)])  # W1 taken for dead: its item went back out
        s.commit()
        repo.claim_item(s, job_id, 0, W2)
        assert repo.fail_item(s, claim.pk, "W1's engine failed late", W1) is False
        got = item(db_url, claim.pk)
        assert (got.status, got.worker, got.error) == ("running", W2, None)
        assert repo.save_result(s, job_id, claim.pk, a_result()) is True
    assert item(db_url, claim.pk).status == "done"


def test_a_model_that_writes_nul_is_stored_with_a_replacement_character(db_url, tmp_path):
    """Byte-level tokenizers have a token for byte 0; Postgres text holds no U+0000, so it is
    stored, on every database, as U+FFFD (a worker failed the whole chunk on it before)."""
    import dataclasses

    result = a_result()
    result = dataclasses.replace(
        result, text="a\x00b", final_answer="1\x00", reasoning="a\x00", content="\x00b",
        steps=[dataclasses.replace(result.steps[0], text="a\x00", draft_text="\x00d")])
    job_id = make_job(db_url, tmp_path, n=1)
    with session_factory(db_url)() as s:
        claim = repo.claim_item(s, job_id, 0, W1)
        assert repo.save_result(s, job_id, claim.pk, result) is True
        out = s.scalar(select(Output).where(Output.item_pk == claim.pk))
        step = s.scalar(select(StepLog).where(StepLog.item_pk == claim.pk))
        assert (out.text, out.final_answer, out.reasoning, out.content) == ("a\ufffdb", "1\ufffd", "a\ufffd", "\ufffdb")
        assert (step.text, step.draft_text) == ("a\ufffd", "\ufffdd")


def test_a_worker_that_cannot_serve_a_chunk_fails_only_the_items_no_worker_holds(db_url, tmp_path):
    """Its engine does not load (`fail_pending`), while another delivery of the chunk, on W2
    whose engine loaded, holds item 0, runs item 1 and has finished item 2."""
    job_id = make_job(db_url, tmp_path, n=4)
    with session_factory(db_url)() as s:
        repo.hold_items(s, job_id, [0, 1, 2], W2)
        s.commit()
        repo.claim_item(s, job_id, 1, W2)
        done = repo.claim_item(s, job_id, 2, W2)
        assert repo.save_result(s, job_id, done.pk, a_result())
        assert repo.fail_pending(s, job_id, [0, 1, 2, 3], "could not load the engine") == 1
        assert repo.claim_item(s, job_id, 0, W2) is not None  # W2 still runs what it held
    assert statuses(db_url, job_id) == {"i0": "running", "i1": "running", "i2": "done", "i3": "failed"}


def failed_then_cancelled(url, tmp_path) -> str:
    """A job whose item 0 failed and whose item 1 was still pending when the job was cancelled."""
    job_id = make_job(url, tmp_path, n=2)
    with session_factory(url)() as s:
        claim = repo.claim_item(s, job_id, 0, W1)
        assert repo.fail_item(s, claim.pk, "boom", W1)
        repo.cancel_job(s, job_id)
    return job_id


def test_a_retry_leaves_a_cancelled_job_cancelled(db_url, tmp_path):
    job_id = failed_then_cancelled(db_url, tmp_path)
    with session_factory(db_url)() as s:
        with pytest.raises(repo.JobCancelled, match=f"job {job_id} is cancelled"):
            repo.reset_failed(s, job_id)
        assert s.get(Job, job_id).status == "cancelled"
    assert statuses(db_url, job_id) == {"i0": "failed", "i1": "cancelled"}


def waiting_on_a_lock(url) -> bool:
    with session_factory(url)() as s:  # a new transaction: pg_stat_activity is read once per transaction
        return s.scalar(text("SELECT count(*) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND wait_event_type = 'Lock'")) > 0


def test_a_retry_that_waits_on_a_cancel_refuses_once_it_commits(pg_db, tmp_path):
    """The cancel has written the job's row, not yet committed, when the retry starts: the
    retry waits for it, then sees the job cancelled (it read the old status and queued the
    job again before)."""
    job_id = make_job(pg_db, tmp_path, n=1)
    with session_factory(pg_db)() as s:
        claim = repo.claim_item(s, job_id, 0, W1)
        assert repo.fail_item(s, claim.pk, "boom", W1)

    def retry_failed():
        with session_factory(pg_db)() as s:
            return repo.reset_failed(s, job_id)

    # the pool outermost: should the wait fail, the cancel's lock goes before the pool waits
    with ThreadPoolExecutor(1) as pool, session_factory(pg_db)() as cancelling:
        cancelling.execute(update(Job).where(Job.id == job_id).values(status="cancelled"))  # cancel_job's first write
        retry = pool.submit(retry_failed)
        wait_for(lambda: waiting_on_a_lock(pg_db), timeout=30, what="the retry to wait on the job's row")
        cancelling.commit()
        with pytest.raises(repo.JobCancelled):
            retry.result(timeout=30)
    with session_factory(pg_db)() as s:
        assert s.get(Job, job_id).status == "cancelled"
    assert statuses(pg_db, job_id) == {"i0": "failed"}

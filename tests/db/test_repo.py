"""The writes that settle an item (`semjobs.db.repo`) are guarded by the state they expect, on
Postgres and on SQLite: a result that comes late (after a cancel, after a failure) stores
nothing and changes nothing, and a worker's failure settles only an item it still holds."""

import pytest
from sqlalchemy import func, select

from semjobs.db import repo
from semjobs.db.models import Item, ItemStats, Job, Output, StepLog
from semjobs.db.session import session_factory
from semspec.types import GenerationConfig
from tests.fake_engine import InstantEngine
from tests.worker.test_process import make_job

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

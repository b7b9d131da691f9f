"""What an input has and wants (semjobs.db.surplus): kept samples counted from any worker's
stored outputs, an unneeded item settled only while its worker holds it, the order of waves."""

import json

import pytest
from sqlalchemy import select

from semjobs.db import repo, surplus
from semjobs.db.models import Item, ItemStats
from semjobs.db.session import session_factory
from semjobs.jobs.submit import job_config, store_job
from semspec.types import Counters, GenerationResult


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request):
    return request.getfixturevalue("sqlite_db" if request.param == "sqlite" else "pg_db")


def job(url, tmp_path, want=None, samples=3):
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"q{i}", "answer": "7"}) + "\n" for i in range(2)))
    job_id, _ = store_job(p, job_config("ar", 8, temperature=0.6), queue="q", url=url, status="queued",
                          samples=samples, want=want)
    return job_id


def finish(url, job_id, seq, answer, finish_reason="eos"):
    result = GenerationResult(text=f"The answer is {answer}.", final_answer=answer, steps=[],
                              counters=Counters(generated_tokens=5), wall_seconds=0.1, finish_reason=finish_reason)
    with session_factory(url)() as s:
        claim = repo.claim_item(s, job_id, seq, "w@h:1")
        assert repo.save_result(s, job_id, claim.pk, result, correct=answer == "7")


def test_an_input_is_satisfied_by_its_kept_samples_only(db_url, tmp_path):
    job_id = job(db_url, tmp_path, want=2)
    finish(db_url, job_id, 0, "7")  # i0: right
    finish(db_url, job_id, 1, "8")  # i0: wrong, not kept
    finish(db_url, job_id, 3, "7")  # i1: right
    with session_factory(db_url)() as s:
        assert surplus.satisfied(s, job_id, {"i0": 2, "i1": 1}) == {"i1"}
        assert surplus.satisfied(s, job_id, {"i0": 1}) == {"i0"}
        assert sorted(surplus.kept_by_input(s, job_id)) == [("i0", 2, 1), ("i1", 1, 1)]


def test_an_unneeded_item_is_settled_only_while_its_worker_holds_it(db_url, tmp_path):
    job_id = job(db_url, tmp_path, want=1)
    with session_factory(db_url)() as s:
        pk = repo.claim_item(s, job_id, 1, "w@h:1").pk
        assert not surplus.settle_unneeded(s, job_id, pk, "another@h:2")
        assert surplus.settle_unneeded(s, job_id, pk, "w@h:1", spent_tokens=40)
        assert not surplus.settle_unneeded(s, job_id, pk, "w@h:1")  # settled already
        assert s.get(Item, pk).status == "unneeded"
        stats = s.scalars(select(ItemStats).where(ItemStats.item_pk == pk)).one()
        assert (stats.cut_tokens, stats.generated_tokens) == (40, 0)


def test_a_wanting_job_goes_in_waves_and_others_keep_an_inputs_samples_together(db_url, tmp_path):
    wanting, plain = job(db_url, tmp_path, want=1), job(db_url, tmp_path)
    with session_factory(db_url)() as s:
        assert surplus.work_order(s, wanting, [0, 1, 2, 3, 4, 5]) == [0, 3, 1, 4, 2, 5]
        assert surplus.work_order(s, wanting, [5, 1]) == [1, 5]
        assert surplus.work_order(s, plain, [0, 1, 2, 3, 4, 5]) == [0, 1, 2, 3, 4, 5]

"""`job_status` calls an active job stalled, and says why, instead of an ETA that keeps
growing: no worker, workers that take nothing, a stopped `semjobs run`. Real Postgres.
And what the text output calls each figure."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from semjobs.db import repo
from semjobs.db.session import session_factory
from semjobs.jobs.status import job_status, progress_line, render
from tests.worker.test_process import make_job


def sql(url, statement, **params):
    with session_factory(url)() as s:
        s.execute(text(statement), params)
        s.commit()


@pytest.fixture
def quiet_job(pg_db, tmp_path):
    """A running job of 6 items, started 11 minutes ago, 2 done a minute later, nothing since."""
    job_id = make_job(pg_db, tmp_path, n=6)
    sql(pg_db, "UPDATE jobs SET status = 'running', queue = 'semjobs.q', "
        "started_at = now() - interval '11 minutes' WHERE id = :j", j=job_id)
    sql(pg_db, "UPDATE items SET status = 'done', finished_at = now() - interval '10 minutes' "
        "WHERE job_id = :j AND seq < 2", j=job_id)
    return job_id


def test_no_worker_beating_is_named_and_there_is_no_eta(pg_db, quiet_job):
    st = job_status(quiet_job, url=pg_db)
    assert st["stalled"].startswith("no item finished for 10m0")
    assert "no worker beats: start `semjobs worker` (queue semjobs.q)" in st["stalled"]
    assert st["eta_s"] is None
    assert "STALLED    no item finished" in render(st) and progress_line(st).endswith("STALLED")


def test_workers_that_take_nothing_are_told_apart_from_a_hang(pg_db, quiet_job):
    with session_factory(pg_db)() as s:
        repo.beat(s, "w@h:1")
    assert "1 worker(s) beat but none takes its 4 pending item(s); do they serve queue semjobs.q?" \
        in job_status(quiet_job, url=pg_db)["stalled"]
    sql(pg_db, "UPDATE items SET status = 'running', worker = 'w@h:1' WHERE job_id = :j AND seq = 2",
        j=quiet_job)
    assert "1 item(s) run: a worker may hang" in job_status(quiet_job, url=pg_db)["stalled"]


def test_a_stopped_embedded_run_says_running_it_again_resumes(pg_db, quiet_job):
    sql(pg_db, "UPDATE jobs SET queue = 'embedded' WHERE id = :j", j=quiet_job)
    assert "running it again resumes the job" in job_status(quiet_job, url=pg_db)["stalled"]


def test_a_job_that_progresses_or_has_ended_is_not_stalled(pg_db, quiet_job):
    sql(pg_db, "UPDATE items SET finished_at = now() WHERE job_id = :j AND seq = 1", j=quiet_job)
    st = job_status(quiet_job, url=pg_db)
    assert st["stalled"] is None and st["eta_s"] is not None
    sql(pg_db, "UPDATE items SET finished_at = now() - interval '10 minutes' WHERE job_id = :j", j=quiet_job)
    sql(pg_db, "UPDATE jobs SET status = 'cancelled' WHERE id = :j", j=quiet_job)
    assert job_status(quiet_job, url=pg_db)["stalled"] is None


def test_the_two_rates_say_which_is_which():
    counts = dict(done=3, running=0, pending=0, failed=0, cancelled=0, unneeded=0, over_budget=0)
    acceptance = dict(steps_drafted=0, steps_accepted=0, step_acceptance=None, drafted_tokens=0,
                      accepted_tokens=0, token_acceptance=None, target_forward_passes=9,
                      draft_forward_passes=0)
    st = dict(id="j", name=None, status="completed", method="ar", queue="embedded", n_items=3,
              counts=counts, generated_tokens=600, elapsed_s=60.0, tokens_per_s=10.0,
              decode_tokens_per_s=25.0, eta_s=None, stalled=None, acceptance=acceptance,
              **{"yield": dict(want=None, kept=0, useful=0)})
    assert ("  tok/s      10.0 overall (generated / elapsed), 25.0 per item (generated / summed item "
            "wall times)") in render(st).splitlines()
    assert "600 tok  10.0 tok/s overall" in progress_line(st)


def test_inputs_are_binned_by_the_share_of_their_samples_kept():
    from semjobs.jobs.status import pass_rate_histogram

    per_input = [("a", 4, 0), ("b", 4, 1), ("c", 4, 2), ("d", 3, 3), ("e", 1, 1)]
    assert pass_rate_histogram(per_input) == {"<=0": 1, "<=0.25": 1, "<=0.5": 1, "<=0.75": 0, "<=1": 2}


def test_what_each_rule_spared_is_estimated_from_the_jobs_own_costs():
    """Two loops cut at 100 tokens spent of a 512 cap spared 2 * 512 - 200; three finished
    samples cost 100 on average, so six unneeded spared 600, less the 50 two aborted ones had
    spent; two over budget spared 200."""
    from semjobs.jobs.status import saved_tokens

    spend = {"eos": (1, 100), "repetition": (2, 200), "unneeded": (2, 50)}
    counts = {"unneeded": 6, "over_budget": 2}
    assert saved_tokens(spend, counts, 512) == {"loops": 824, "unneeded": 550, "over_budget": 200}


def test_useful_samples_count_at_most_what_each_input_wants(sqlite_db, tmp_path):
    """A line wanting 1 of 3 with two right samples stored (by two workers at once, say)
    counts one useful; a line without a want counts every kept sample; only the wanting
    input can be full."""
    import json

    from semjobs.jobs.submit import job_config, store_job
    from semspec.types import Counters, GenerationResult

    p = tmp_path / "in.jsonl"
    p.write_text(json.dumps({"id": "w", "prompt": "q", "answer": "7", "n": 3, "want": 1}) + "\n"
                 + json.dumps({"id": "all", "prompt": "r", "answer": "7", "n": 2}) + "\n")
    job_id, _ = store_job(p, job_config("ar", 8, temperature=0.6), queue="q", url=sqlite_db, status="queued")
    right = GenerationResult(text="7", final_answer="7", steps=[], counters=Counters(generated_tokens=1),
                             wall_seconds=0.1, finish_reason="eos")
    with session_factory(sqlite_db)() as s:
        for seq in (0, 1, 3, 4):  # w's samples 0 and 1, all's 0 and 1
            claim = repo.claim_item(s, job_id, seq, "w@h:1")
            assert repo.save_result(s, job_id, claim.pk, right, correct=True)
    y = job_status(job_id, url=sqlite_db)["yield"]
    assert (y["want"], y["kept"], y["useful"], y["full_inputs"], y["covered_inputs"]) == (None, 4, 3, 1, 2)


def test_samples_a_rule_stopped_early_are_counted_and_never_kept(sqlite_db, tmp_path):
    """A sample stored as a loop and two the doom rule stopped (a right answer in one's text,
    broken off): the status counts each rule's, and keeps neither doomed one."""
    import json

    from semjobs.jobs.status import kept_line
    from semjobs.jobs.submit import job_config, store_job
    from semspec.types import Counters, GenerationResult

    p = tmp_path / "in.jsonl"
    p.write_text(json.dumps({"id": "a", "prompt": "q", "answer": "7", "n": 4}) + "\n")
    job_id, _ = store_job(p, job_config("ar", 8, temperature=0.6), queue="q", url=sqlite_db, status="queued")
    with session_factory(sqlite_db)() as s:
        for seq, finish in enumerate(("eos", "repetition", "doomed", "doomed")):
            result = GenerationResult(text="7", final_answer="7", steps=[], counters=Counters(generated_tokens=3),
                                      wall_seconds=0.1, finish_reason=finish)
            claim = repo.claim_item(s, job_id, seq, "w@h:1")
            assert repo.save_result(s, job_id, claim.pk, result, correct=True)
    y = job_status(job_id, url=sqlite_db)["yield"]
    assert y["stopped_early"] == {"loops": 1, "doomed": 2} and y["kept"] == 2
    assert kept_line(y).endswith("; stopped early: 1 loops, 2 doomed")

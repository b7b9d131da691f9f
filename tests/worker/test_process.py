"""The shared per-item code (`semjobs.worker.process.run_items`) with the instant test-double engine:
idempotent commits, attempt cap, cooperative cancel, failures, chunk deadline."""

import json
import time

import pytest
from sqlalchemy import func, select, update

from semjobs.db import repo
from semjobs.db.models import Item, ItemStats, Job, Output, StepLog
from semjobs.db.session import session_factory
from semjobs.jobs.submit import job_config, store_job
from tests.conftest import wait_for
from semjobs.worker.process import run_items


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request):
    return request.getfixturevalue("sqlite_db" if request.param == "sqlite" else "pg_db")


def make_job(url, tmp_path, n=6, fail=()):
    p = tmp_path / "in.jsonl"
    with open(p, "w") as f:
        for i in range(n):
            prompt = f"question number {i}" + (" FAIL" if i in fail else "")
            f.write(json.dumps({"id": f"i{i}", "prompt": prompt}) + "\n")
    job_id, _ = store_job(p, job_config("ar", 16), queue="q", url=url, status="queued")
    return job_id


def count(url, model, job_id):
    with session_factory(url)() as s:
        return s.scalar(select(func.count()).select_from(model).where(model.job_id == job_id))


def statuses(url, job_id):
    with session_factory(url)() as s:
        return dict(s.execute(select(Item.item_id, Item.status).where(Item.job_id == job_id)).all())


def test_run_items_fills_every_table_and_completes_job(db_url, tmp_path, fake_engine):
    job_id = make_job(db_url, tmp_path, n=6, fail={2})
    rep = run_items(job_id, list(range(6)), url=db_url)
    assert (rep.done, rep.failed) == (5, 1)
    assert count(db_url, Output, job_id) == 5
    assert count(db_url, ItemStats, job_id) == 5
    assert count(db_url, StepLog, job_id) == 10
    with session_factory(db_url)() as s:
        job = s.get(Job, job_id)
        assert job.status == "completed" and job.finished_at and job.started_at
        assert job.manifest["identities"]["target"].startswith("fake-instant")
        failed = s.scalars(select(Item).where(Item.job_id == job_id, Item.status == "failed")).one()
        assert failed.item_id == "i2" and "fake engine asked to fail" in failed.error
        st = s.scalars(select(ItemStats).where(ItemStats.job_id == job_id)).first()
        assert st.target_forward_passes == 3 and st.steps_drafted == 2 and st.n_steps == 2
        first, second = s.scalars(select(StepLog).order_by(StepLog.id).limit(2))
        assert (first.author, first.decision, first.p_target) == ("draft", "accepted", 0.9)
        assert (first.target_tokens, first.draft_text, first.judge_score) == (5, None, None)
        assert (second.target_tokens, second.draft_text, second.judge_score) == (
            4, "The answer is unknown.", 3)


def test_redelivery_skips_done_items_and_never_duplicates(db_url, tmp_path, fake_engine):
    job_id = make_job(db_url, tmp_path, n=4)
    run_items(job_id, [0, 1, 2, 3], url=db_url)
    rep = run_items(job_id, [0, 1, 2, 3], url=db_url)
    assert (rep.done, rep.skipped) == (0, 4)
    assert count(db_url, Output, job_id) == 4


def test_concurrent_second_commit_is_dropped(db_url, tmp_path, fake_engine):
    from tests.fake_engine import InstantEngine
    from semspec.types import GenerationConfig

    job_id = make_job(db_url, tmp_path, n=1)
    with session_factory(db_url)() as s:
        a = repo.claim_item(s, job_id, 0, "w1")
        b = repo.claim_item(s, job_id, 0, "w2")  # e.g. redelivered while w1 still runs
        assert (a.attempts, b.attempts) == (1, 2)
        result = InstantEngine().generate("a prompt", GenerationConfig(max_new_tokens=8))
        assert repo.save_result(s, job_id, a.pk, result) is True
        assert repo.save_result(s, job_id, b.pk, result) is False
    assert count(db_url, Output, job_id) == 1
    assert count(db_url, StepLog, job_id) == 2


def test_a_second_delivery_in_the_same_process_does_not_decode_the_item_again(db_url, tmp_path,
                                                                             fake_engine, monkeypatch):
    """Two chunks with the same items in one process (a chunk handed out again to the worker
    that still runs it): each item is decoded once; the second chunk skips what the first
    is decoding, though to the database both are this worker's."""
    import threading

    from semjobs.worker import engine as engines

    monkeypatch.setenv("FAKE_ENGINE_DELAY_S", "0.3")
    engines._cache.clear()
    job_id = make_job(db_url, tmp_path, n=4)
    reports = []
    chunks = [threading.Thread(target=lambda: reports.append(run_items(job_id, [0, 1, 2, 3], url=db_url,
                                                                       worker="w@h:1")))
              for _ in range(2)]
    for t in chunks:
        t.start()
    for t in chunks:
        t.join()
    assert engines.get_engine().calls == 4
    assert (sum(r.done for r in reports), sum(r.skipped for r in reports)) == (4, 4)
    assert count(db_url, Output, job_id) == 4


def test_attempt_cap_fails_an_item_that_keeps_killing_workers(db_url, tmp_path, fake_engine,
                                                               monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "max_attempts", 2)
    job_id = make_job(db_url, tmp_path, n=2)
    with session_factory(db_url)() as s:  # two deliveries that died mid-item
        repo.claim_item(s, job_id, 0, "dead1")
        repo.claim_item(s, job_id, 0, "dead2")
    rep = run_items(job_id, [0, 1], url=db_url)
    assert (rep.done, rep.failed) == (1, 1)
    with session_factory(db_url)() as s:
        item = s.scalars(select(Item).where(Item.job_id == job_id, Item.seq == 0)).one()
        assert item.status == "failed" and "gave up after 2 deliveries" in item.error
        assert s.get(Job, job_id).status == "completed"


def test_cancel_stops_new_items_from_starting(db_url, tmp_path, fake_engine, monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "batch_size", 2)
    job_id = make_job(db_url, tmp_path, n=8)

    def cancel_after_two(kind, seq):
        if seq == 1:
            with session_factory(db_url)() as s:
                repo.cancel_job(s, job_id)

    rep = run_items(job_id, list(range(8)), url=db_url, on_item=cancel_after_two)
    # what had started when the job was cancelled finishes or is aborted (at most a batch
    # more done), the rest never starts
    assert rep.cancelled and 2 <= rep.done <= 2 + settings.batch_size
    st = statuses(db_url, job_id)
    assert [st[f"i{i}"] for i in range(8)] == ["done"] * rep.done + ["cancelled"] * (8 - rep.done)
    # a redelivered chunk of a cancelled job does nothing
    done = rep.done
    rep = run_items(job_id, list(range(8)), url=db_url)
    assert rep.done == 0 and count(db_url, Output, job_id) == done
    with session_factory(db_url)() as s:
        assert s.get(Job, job_id).status == "cancelled"


def test_a_cancel_aborts_the_items_decoding_and_spares_another_jobs(db_url, tmp_path, fake_engine,
                                                                    monkeypatch):
    """Items decoding when their job is cancelled stop within about a second (the chunk
    asks once a second) and end cancelled; another job's items in the same batch loop
    decode on to the end."""
    import threading

    from semjobs.settings import settings
    from semjobs.worker import engine as engines

    monkeypatch.setenv("FAKE_ENGINE_DELAY_S", "3")
    monkeypatch.setattr(settings, "batch_size", 4)
    engines._cache.clear()
    spared, doomed = make_job(db_url, tmp_path, n=2), make_job(db_url, tmp_path, n=6)
    reports = {}

    def chunk(job_id, n):
        reports[job_id] = run_items(job_id, list(range(n)), url=db_url, worker="w@h:1")

    def running(job_id):
        return list(statuses(db_url, job_id).values()).count("running")

    spared_chunk = threading.Thread(target=chunk, args=(spared, 2))
    spared_chunk.start()
    wait_for(lambda: running(spared) == 2, 10, interval=0.05, what="the first job decoding")
    doomed_chunk = threading.Thread(target=chunk, args=(doomed, 6))
    doomed_chunk.start()
    wait_for(lambda: running(doomed) == 2, 10, interval=0.05, what="the second job in the other two slots")
    with session_factory(db_url)() as s:
        repo.cancel_job(s, doomed)
    t0 = time.monotonic()
    doomed_chunk.join(timeout=10)
    assert time.monotonic() - t0 < 2.5 and spared_chunk.is_alive()  # well before its 3 s items end
    spared_chunk.join(timeout=10)
    rep = reports[doomed]
    assert rep.cancelled and (rep.aborted, rep.done, rep.failed) == (2, 0, 0)
    assert set(statuses(db_url, doomed).values()) == {"cancelled"}
    assert count(db_url, Output, doomed) == 0
    assert reports[spared].done == 2 and set(statuses(db_url, spared).values()) == {"done"}
    with session_factory(db_url)() as s:
        assert (s.get(Job, doomed).status, s.get(Job, spared).status) == ("cancelled", "completed")


def test_an_aborted_item_is_cancelled_only_while_this_worker_runs_it(db_url, tmp_path):
    from semspec.types import GenerationConfig
    from tests.fake_engine import InstantEngine

    job_id = make_job(db_url, tmp_path, n=3)
    with session_factory(db_url)() as s:
        mine, taken, done = (repo.claim_item(s, job_id, seq, "w1") for seq in range(3))
        repo.claim_item(s, job_id, 1, "w2")  # handed to another worker meanwhile (w1 looked dead)
        repo.save_result(s, job_id, done.pk, InstantEngine().generate("q", GenerationConfig(max_new_tokens=4)))
        assert [repo.cancel_running(s, c.pk, "w1") for c in (mine, taken, done)] == [True, False, False]
    assert statuses(db_url, job_id) == {"i0": "cancelled", "i1": "running", "i2": "done"}


def test_running_item_of_dead_worker_is_cancelled_by_next_delivery(db_url, tmp_path, fake_engine):
    job_id = make_job(db_url, tmp_path, n=2)
    with session_factory(db_url)() as s:
        repo.claim_item(s, job_id, 0, "dead")
        repo.cancel_job(s, job_id)
    run_items(job_id, [0, 1], url=db_url)
    assert set(statuses(db_url, job_id).values()) == {"cancelled"}


def test_retry_resets_only_failed_items(db_url, tmp_path, fake_engine):
    job_id = make_job(db_url, tmp_path, n=3, fail={1})
    run_items(job_id, [0, 1, 2], url=db_url)
    with session_factory(db_url)() as s:
        assert repo.reset_failed(s, job_id) == [1]
        assert s.get(Job, job_id).status == "queued"
        item = s.scalars(select(Item).where(Item.job_id == job_id, Item.seq == 1)).one()
        assert (item.status, item.attempts, item.error) == ("pending", 0, None)
    assert statuses(db_url, job_id) == {"i0": "done", "i1": "pending", "i2": "done"}


def test_deadline_hands_back_the_rest(db_url, tmp_path, fake_engine):
    job_id = make_job(db_url, tmp_path, n=4)
    rep = run_items(job_id, [0, 1, 2, 3], url=db_url, deadline=time.monotonic() - 1)
    assert rep.done == 1 and rep.left == [1, 2, 3]
    with session_factory(db_url)() as s:
        assert s.get(Job, job_id).status == "running"


def test_a_result_that_comes_late_is_not_stored_and_the_other_items_finish(db_url, tmp_path, fake_engine,
                                                                           monkeypatch):
    """An item settled elsewhere while it decodes here (failed by another worker's watchdog or
    attempt cap, say): its result is counted late and dropped, the item stays failed, and
    nothing else of the chunk suffers."""
    import threading

    from semjobs.worker import engine as engines

    monkeypatch.setenv("FAKE_ENGINE_DELAY_S", "1")
    engines._cache.clear()
    job_id = make_job(db_url, tmp_path, n=3)
    reports = []
    chunk = threading.Thread(target=lambda: reports.append(run_items(job_id, [0, 1, 2], url=db_url)))
    chunk.start()
    wait_for(lambda: statuses(db_url, job_id)["i0"] == "running", 10, interval=0.02, what="item 0 decoding")
    with session_factory(db_url)() as s:
        s.execute(update(Item).where(Item.job_id == job_id, Item.seq == 0)
                  .values(status="failed", error="settled elsewhere"))
        s.commit()
    chunk.join(timeout=30)
    (rep,) = reports
    assert (rep.done, rep.late, rep.failed, rep.duplicates) == (2, 1, 0, 0)
    assert statuses(db_url, job_id) == {"i0": "failed", "i1": "done", "i2": "done"}
    assert count(db_url, Output, job_id) == 2
    with session_factory(db_url)() as s:
        assert s.get(Job, job_id).status == "completed"


def test_a_hung_engine_fails_the_item_it_hung_on_and_the_rest_is_done_elsewhere(db_url, tmp_path, fake_engine,
                                                                                 monkeypatch):
    """The watchdog: an engine stuck starting one item (HANG: a chat template that loops)
    makes no progress; within the progress timeout that item fails with the reason, the
    chunk's other items are handed back, and another worker does them: each item settled
    once, one output each."""
    from semjobs.settings import settings
    from semjobs.worker import engine as engines
    from tests.conftest import FAKE_ENGINE

    monkeypatch.setattr(settings, "engine_factory", "tests.worker.test_batching:HangingEngine.load")
    monkeypatch.setattr(settings, "progress_timeout_s", 1.0)
    monkeypatch.setattr(settings, "batch_size", 4)
    p = tmp_path / "hang.jsonl"
    p.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"question {i}" + (" HANG" if i == 2 else "")}) + "\n"
                         for i in range(6)))
    job_id, _ = store_job(p, job_config("ar", 16), queue="q", url=db_url, status="queued")
    hanging = engines.get_engine()
    try:
        t0 = time.monotonic()
        rep = run_items(job_id, list(range(6)), url=db_url, worker="w1@h:1")
        assert time.monotonic() - t0 < settings.progress_timeout_s + 3
    finally:
        hanging.release.set()
    assert rep.hung and rep.failed == 1 and rep.done + len(rep.left) == 5 and 2 not in rep.left
    with session_factory(db_url)() as s:
        stuck = s.scalars(select(Item).where(Item.job_id == job_id, Item.seq == 2)).one()
        assert stuck.status == "failed" and "no progress for 1 s: the engine hung on this item" in stuck.error
        assert {i.seq: (i.status, i.worker) for i in s.scalars(select(Item).where(Item.seq.in_(rep.left)))} \
            == {seq: ("pending", None) for seq in rep.left}

    monkeypatch.setattr(settings, "engine_factory", FAKE_ENGINE)  # another worker, a sound engine
    again = run_items(job_id, rep.left, url=db_url, worker="w2@h:2")
    assert (again.done, again.failed, again.hung) == (len(rep.left), 0, False)
    assert statuses(db_url, job_id) == {f"i{i}": "failed" if i == 2 else "done" for i in range(6)}
    assert count(db_url, Output, job_id) == 5
    with session_factory(db_url)() as s:
        assert s.get(Job, job_id).status == "completed"


def make_wanting_job(url, tmp_path, inputs=2, samples=4, want=1, reference="3"):
    """Inputs "question number i" (the fake engine's sample 0 answers 3, its later samples
    3 + seed % 3), each with ``samples`` samples of which ``want`` kept ones are enough."""
    p = tmp_path / "wanting.jsonl"
    with open(p, "w") as f:
        for i in range(inputs):
            f.write(json.dumps({"id": f"i{i}", "prompt": f"question number {i}", "answer": reference}) + "\n")
    job_id, n = store_job(p, job_config("ar", 16, temperature=0.6), queue="q", url=url, status="queued",
                          samples=samples, want=want)
    return job_id, n


def test_an_input_with_the_kept_samples_it_wants_decodes_no_more(db_url, tmp_path, fake_engine, monkeypatch):
    """In waves (every input's first sample, then every input's second, ...) one at a time:
    each input's first sample is right, so its three others end unneeded, undecoded; the
    job completes and counts them apart from failed and cancelled."""
    from semjobs.jobs.status import job_status
    from semjobs.jobs.submit import work_order
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "batch_size", 1)
    job_id, n = make_wanting_job(db_url, tmp_path)
    seqs, in_waves = work_order(job_id, list(range(n)), db_url)
    assert in_waves and seqs == [0, 4, 1, 5, 2, 6, 3, 7]  # input i's sample k is seq 4 i + k
    rep = run_items(job_id, seqs, url=db_url)
    assert (rep.done, rep.unneeded, rep.failed) == (2, 6, 0)
    assert count(db_url, Output, job_id) == 2 and count(db_url, ItemStats, job_id) == 2
    with session_factory(db_url)() as s:
        samples = dict(s.execute(select(Item.seq, Item.status).where(Item.job_id == job_id)).all())
    assert [seq for seq, status in samples.items() if status == "done"] == [0, 4]
    st = job_status(job_id, url=db_url)
    assert st["status"] == "completed" and st["counts"]["unneeded"] == 6
    y = st["yield"]
    assert (y["want"], y["kept"], y["useful"], y["covered_inputs"], y["full_inputs"]) == (1, 2, 2, 2, 2)
    per_sample = st["generated_tokens"] // 2  # the fake engine's two answers are as long
    assert y["saved_tokens_estimate"]["unneeded"] == 6 * per_sample and y["pass_rates"]["<=1"] == 2


def test_a_wrong_sample_is_not_enough_and_the_next_wave_decodes(db_url, tmp_path, fake_engine, monkeypatch):
    """Without a right answer among an input's samples every sample decodes: wrong ones are
    not kept (reference 99: the fake engine never says it)."""
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "batch_size", 1)
    job_id, n = make_wanting_job(db_url, tmp_path, inputs=1, reference="99")
    rep = run_items(job_id, list(range(n)), url=db_url)
    assert (rep.done, rep.unneeded) == (4, 0)
    with session_factory(db_url)() as s:
        assert s.scalars(select(Output.kept).where(Output.job_id == job_id)).all() == [False] * 4


def test_samples_decoding_when_another_worker_stores_enough_are_aborted(db_url, tmp_path, fake_engine,
                                                                        monkeypatch):
    """Three samples of an input decode here (3 s each); another worker stores a right one of
    the same input: within about a second (the chunk asks once a second) the three stop and
    end unneeded, their partial tokens counted as cut."""
    import threading

    from semjobs.settings import settings
    from semjobs.worker import engine as engines
    from semspec.types import Counters, GenerationResult

    monkeypatch.setenv("FAKE_ENGINE_DELAY_S", "3")
    monkeypatch.setattr(settings, "batch_size", 4)
    engines._cache.clear()
    job_id, _ = make_wanting_job(db_url, tmp_path, inputs=1)
    reports = {}
    chunk = threading.Thread(target=lambda: reports.setdefault("r", run_items(job_id, [1, 2, 3], url=db_url,
                                                                               worker="w@h:1")))
    chunk.start()
    wait_for(lambda: list(statuses_by_seq(db_url, job_id).values()).count("running") == 3, 10, interval=0.05,
             what="three samples decoding")
    right = GenerationResult(text="The answer is 3.", final_answer="3", steps=[], counters=Counters(generated_tokens=5),
                             wall_seconds=0.1, finish_reason="eos")
    with session_factory(db_url)() as s:
        claim = repo.claim_item(s, job_id, 0, "other@h:2")
        assert repo.save_result(s, job_id, claim.pk, right, correct=True)
    t0 = time.monotonic()
    chunk.join(timeout=10)
    assert time.monotonic() - t0 < 2.5  # well before their 3 s end
    rep = reports["r"]
    assert (rep.unneeded, rep.done, rep.aborted) == (3, 0, 0)
    assert statuses_by_seq(db_url, job_id) == {0: "done", 1: "unneeded", 2: "unneeded", 3: "unneeded"}
    with session_factory(db_url)() as s:
        assert s.get(Job, job_id).status == "completed"


def statuses_by_seq(url, job_id):
    with session_factory(url)() as s:
        return dict(s.execute(select(Item.seq, Item.status).where(Item.job_id == job_id)).all())


def test_once_the_job_has_spent_its_token_budget_no_sample_starts(db_url, tmp_path, fake_engine, monkeypatch):
    """A budget of 5 tokens: the first sample (9 of the fake engine's tokens) spends it, so
    the others end over_budget, undecoded, and the job completes."""
    from semjobs.jobs.status import job_status
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "batch_size", 1)
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"question number {i}"}) + "\n" for i in range(4)))
    job_id, n = store_job(p, job_config("ar", 16), queue="q", url=db_url, status="queued", budget_tokens=5)
    rep = run_items(job_id, list(range(n)), url=db_url)
    assert (rep.done, rep.over_budget) == (1, 3)
    st = job_status(job_id, url=db_url)
    assert st["status"] == "completed" and st["counts"]["over_budget"] == 3
    assert st["yield"]["budget_tokens"] == 5 and st["yield"]["spent_tokens"] == st["generated_tokens"] > 5


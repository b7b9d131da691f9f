"""semjobs.jobs.calibration on real Postgres, with a stand-in for the collection itself (it writes a
calibration directory as `semspec.calibration.collect.collect` does; the real one runs in
tests/worker/test_calibration_e2e.py): questions stored, run once each, a redelivery stores
nothing twice, another pair is refused, the attempt cap holds, the export is a directory
that `probe label/train` read."""

from __future__ import annotations

import pytest
import torch

from semjobs.jobs import calibration as cal
from semspec.calibration.collect import CollectConfig
from semspec.calibration.store import CalibrationStore, PrefixRecord, prefix_key

PROMPTS = [("q1", "What is 2+2?"), ("q2", "What is 3+3?")]


class Pair:
    """What run_question reads of the loaded models before it collects: roles and identities
    (none recorded: the calibration's first question records them)."""

    engine = "transformers float32"  # what a collection that records none ran on

    def __init__(self, roles=("target", "draft")):
        self.roles = roles

    def describe(self, role):
        return {}


PAIR, TARGET_ONLY = Pair(), Pair(("target",))


def fake_collect(model_name="pair-a"):
    calls = []

    def collect(models, prompts, out_dir, cfg):
        (qid, prompt), = prompts
        calls.append(qid)
        store = CalibrationStore(out_dir)
        store.init({"target": model_name, "draft": "d", "models": {}, "layer": {}, "pooling": "mean",
                    "samples": cfg.samples, "temperature": cfg.temperature, "top_p": cfg.top_p,
                    "step_delimiter": cfg.step_delimiter, "max_step_tokens": cfg.max_step_tokens,
                    "max_trace_tokens": cfg.max_trace_tokens, "trace_temperature": cfg.trace_temperature,
                    "seed": cfg.seed, "prompts": 1})
        store.append_trace(qid, ["step one\n", "step two\n"])
        for k in range(2):
            store.write_prefix(PrefixRecord(prefix_key(qid, k), qid, k, prompt, "step one\n" * k,
                                            ["a", "b"], ["target", "draft"],
                                            {"target": torch.ones(2, 4) * k, "draft": torch.zeros(2, 3)}))

    return collect, calls


def test_each_question_runs_once_and_exports_as_a_calibration_directory(pg_db, tmp_path):
    cal_id = cal.create(PROMPTS, CollectConfig(samples=2), "q", url=pg_db)
    assert cal.pending_questions(cal_id, url=pg_db) == ["q1", "q2"]
    collect, calls = fake_collect()
    for qid in ("q1", "q2", "q1"):  # the last: a redelivery
        cal.run_question(cal_id, qid, PAIR, "w@h:1", url=pg_db, collect=collect)
    assert calls == ["q1", "q2"]
    assert cal.counts(cal_id, url=pg_db) == {"pending": 0, "running": 0, "done": 2, "failed": 0, "prefixes": 4}
    stats = cal.export(cal_id, tmp_path / "out", url=pg_db)
    assert stats == {"questions_done": 2, "questions": 2, "prefixes": 4}
    store = CalibrationStore(tmp_path / "out")
    assert store.keys() == ["q1__000", "q1__001", "q2__000", "q2__001"]
    assert store.load_traces()["q2"] == ["step one\n", "step two\n"]
    rec = store.read_prefix("q2__001")
    assert rec.texts == ["a", "b"] and torch.equal(rec.features["target"], torch.ones(2, 4))
    assert store.meta()["prompts"] == 2 and store.meta()["calibration"] == cal_id


def test_another_pair_and_a_worker_without_a_draft_are_refused(pg_db):
    cal_id = cal.create(PROMPTS, CollectConfig(samples=2), "q", url=pg_db)
    cal.run_question(cal_id, "q1", PAIR, "w@h:1", url=pg_db, collect=fake_collect("pair-a")[0])
    assert cal.run_question(cal_id, "q2", PAIR, "w@h:2", url=pg_db,
                            collect=fake_collect("pair-b")[0]) == "failed"
    assert cal.counts(cal_id, url=pg_db)["prefixes"] == 2  # nothing of the other pair stored
    other = cal.create(PROMPTS, CollectConfig(samples=2), "q", url=pg_db)
    assert cal.run_question(other, "q1", TARGET_ONLY, "w@h:1", url=pg_db, collect=fake_collect()[0]) == "failed"



def test_a_worker_sampling_on_another_engine_is_refused_before_the_work(pg_db):
    """Samples and states of one calibration come from one engine (vLLM and transformers, or
    float32 and bfloat16, differ in what the probes read)."""
    cal_id = cal.create(PROMPTS, CollectConfig(samples=2), "q", url=pg_db)
    cal.run_question(cal_id, "q1", PAIR, "w@h:1", url=pg_db, collect=fake_collect()[0])
    on_vllm = Pair()
    on_vllm.engine = "vllm 0.32.0 bfloat16"
    collect, calls = fake_collect()
    assert cal.run_question(cal_id, "q2", on_vllm, "w@h:2", url=pg_db, collect=collect) == "failed"
    assert calls == [] and cal.counts(cal_id, url=pg_db)["failed"] == 1


def test_a_question_that_keeps_killing_workers_fails_after_the_attempt_cap(pg_db, monkeypatch):
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "max_attempts", 2)
    cal_id = cal.create(PROMPTS, CollectConfig(samples=2), "q", url=pg_db)

    def dies(*_a, **_k):
        raise KeyboardInterrupt  # stands in for a process killed mid-question

    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            cal.run_question(cal_id, "q1", PAIR, "w@h:1", url=pg_db, collect=dies)
    assert cal.run_question(cal_id, "q1", PAIR, "w@h:1", url=pg_db, collect=dies) == "failed"
    assert cal.counts(cal_id, url=pg_db)["failed"] == 1
    with pytest.raises(cal.CalibrationError, match="no calibration"):
        cal.counts("nope", url=pg_db)


def test_a_question_another_live_worker_runs_is_busy_and_a_failing_one_fails_with_its_reason(pg_db):
    from semjobs.db import repo
    from semjobs.db.session import session_factory

    cal_id = cal.create(PROMPTS, CollectConfig(samples=2), "q", url=pg_db)
    with session_factory(pg_db)() as s:
        repo.beat(s, "first@h:1")

    def still_running(*_a, **_k):  # the first worker holds q1 when a second delivery comes
        assert cal.run_question(cal_id, "q1", PAIR, "second@h:2", url=pg_db,
                                collect=fake_collect()[0]) == "busy"
        fake_collect()[0](*_a, **_k)

    assert cal.run_question(cal_id, "q1", PAIR, "first@h:1", url=pg_db, collect=still_running) == "done"

    def broken(*_a, **_k):
        raise RuntimeError("CUDA out of memory")

    assert cal.run_question(cal_id, "q2", PAIR, "first@h:1", url=pg_db, collect=broken) == "failed"
    assert cal.counts(cal_id, url=pg_db) == {"pending": 0, "running": 0, "done": 1, "failed": 1, "prefixes": 2}

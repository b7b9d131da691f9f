"""The step engine's writer (semspec.engine.step_engine): the target's own writing in the
drafting methods speculates tokens in a third engine (here with vLLM's ngram drafting, on a
tiny random target that is also its own draft)."""

from __future__ import annotations

import gc

import pytest

from semspec.probes import ProbePair
from semspec.types import NGRAM_DRAFT
from tests.conftest import require_vllm
from tests.semspec.engine.test_step_engine import config

PROMPTS = ["What is 2+2? 2+2 is 4. What is 2+2?", "Name a colour.", "Count to three: one two three.", "Say hi."]


@pytest.fixture(scope="module")
def engine(tiny_vllm_dir, tmp_path_factory, tiny_cache):
    require_vllm()
    from semspec.engine.step_engine import VLLMStepEngine

    probes = ProbePair.always_reject(256, 256).save(tmp_path_factory.mktemp("probes"))
    eng = VLLMStepEngine.load(str(tiny_vllm_dir), draft=str(tiny_vllm_dir), probes=str(probes), device="cpu",
                              cache_dir=tiny_cache, dtype="float32", batch_size=4, kv_cache_gb=0.1,
                              token_draft=NGRAM_DRAFT, draft_tokens=3)
    yield eng
    del eng
    gc.collect()


def texts(engine, cfg):
    done = {d.key: d for d in engine.generate_many(PROMPTS, cfg, batch_size=4)}
    assert all(d.error is None for d in done.values()), [d.error for d in done.values()]
    return [done[i].result.text for i in range(len(PROMPTS))]


def test_the_targets_rewrites_go_to_the_writer_and_stay_the_targets_own(engine):
    """Every step rejected: the target rewrites each, on the speculating writer; greedy and
    lossless, the text is ar's (which never uses the writer)."""
    assert engine.identities["token_draft"].startswith(f"{NGRAM_DRAFT}@sha256:")
    before = (engine.writer.steps, engine.target.steps)
    ar = texts(engine, config("ar"))
    assert engine.writer.steps == before[0] and engine.target.steps > before[1]
    assert texts(engine, config("semspec")) == ar
    assert engine.writer.steps > before[0]


def test_paused_beside_other_sequences_the_writing_stays_on_the_writer(engine):
    """Drafting paused for the batch (4 in flight, draft_max_batch 1): the target's writing
    still goes to the writer (which drafts tokens only while few requests run in it), not to
    the states engine; a job without token speculation writes on the target. Greedy, the
    text is ar's."""
    from semspec.stepwise import TARGET, WRITE_PHASE, Call

    write = Call(TARGET, [1, 2, 3], 8, WRITE_PHASE)
    paused = engine.new_program(PROMPTS[0], config("semspec", draft_max_batch=1), lambda: len(PROMPTS))
    assert engine._served(write, paused) is engine.writer
    plain = engine.new_program(PROMPTS[0], config("semspec", draft_max_batch=1, token_speculation=False),
                               lambda: len(PROMPTS))
    assert engine._served(write, plain) is engine.target
    before = engine.writer.steps
    assert texts(engine, config("semspec", draft_max_batch=1)) == texts(engine, config("ar"))
    assert engine.writer.steps > before


def test_a_sampled_sequences_first_request_takes_the_jobs_seed(engine, monkeypatch):
    """As ar's and token_sd's one request does, so a sequence that drafts nothing writes their
    sample; its later requests take other numbers. (Paused beside the batch, each prompt's
    first request is a write-ahead on the writer.)"""
    seeds = []
    add = engine.writer.llm.add_request

    def spy(request_id, prompt, params, *args, **kwargs):
        seeds.append(params.seed)
        return add(request_id, prompt, params, *args, **kwargs)

    monkeypatch.setattr(engine.writer.llm, "add_request", spy)
    texts(engine, config("semspec", temperature=0.8, top_p=0.95, seed=5, draft_max_batch=1))
    assert seeds[:len(PROMPTS)] == [5] * len(PROMPTS) and 5 not in seeds[len(PROMPTS):]


def test_only_a_job_the_writer_wrote_for_names_its_draft(engine):
    models = {m: engine.generate(PROMPTS[1], config(m, **kw)).models
              for m, kw in (("ar", {}), ("semspec", {}), ("step_judge", {"token_speculation": False}))}
    assert "token_draft" in models["semspec"]
    assert "token_draft" not in models["ar"] and "token_draft" not in models["step_judge"]


def test_a_job_can_leave_the_writer_out(engine):
    before = engine.writer.steps
    plain = texts(engine, config("semspec", token_speculation=False))
    assert engine.writer.steps == before
    assert plain == texts(engine, config("semspec"))


def test_a_seeded_sample_through_the_writer_reruns_alike(engine):
    sampled = config("semspec", temperature=0.8, top_p=0.95, seed=5)
    assert texts(engine, sampled) == texts(engine, sampled)


def test_the_engine_measures_what_the_adaptive_rule_weighs(engine):
    """Per written token on the writer, per drafted token, per verification: booked from the
    calls themselves, and handed to a job that leaves its costs to the engine."""
    engine.reset_meters()
    texts(engine, config("semspec"))
    costs = engine.live_costs(config("semspec"))
    assert costs.write is engine.writer.meter and costs.draft is engine.draft.meter
    assert costs.ratios() is not None and all(r > 0 for r in costs.ratios())
    assert engine.live_costs(config("semspec", token_speculation=False)).write is engine.target.meter


def test_no_writer_without_a_token_draft(tiny_vllm_dir, tmp_path_factory, tiny_cache, engine):
    """'none', or a target with no token draft of its own (no embedded head fits it). Last:
    dropping an engine tears down vLLM's per-process state the module's engine runs on."""
    from semspec.engine.step_engine import VLLMStepEngine

    probes = ProbePair.always_reject(256, 256).save(tmp_path_factory.mktemp("probes-none"))
    for token_draft in ("none", None):
        eng = VLLMStepEngine.load(str(tiny_vllm_dir), draft=str(tiny_vllm_dir), probes=str(probes), device="cpu",
                                  cache_dir=tiny_cache, dtype="float32", batch_size=4, kv_cache_gb=0.1,
                                  token_draft=token_draft)
        try:
            assert eng.writer is None and "token_draft" not in eng.identities
        finally:
            del eng
            gc.collect()

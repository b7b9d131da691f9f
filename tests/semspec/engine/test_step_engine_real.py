"""SemanticSpec on vLLM with the embedded SmolLM2 pair and its shipped probes (float32,
greedy): the defaults load and decode; with probes forced to reject, the target writes every
step, so the text is ar's (but where a model's two best tokens are a rounding apart); forced to
accept, every drafted step is kept; the states vLLM hands the probes are transformers'."""

from __future__ import annotations

import gc

import pytest
import torch

from semspec.probes import ProbePair
from semspec.types import GenerationConfig
from tests.conftest import require_vllm

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

QUESTIONS = [
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
    "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck "
    "egg. How much in dollars does she make every day?",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
]
GREEDY = dict(max_new_tokens=96, temperature=0.0, adaptive=False, draft_max_batch=0)


@pytest.fixture(scope="module")
def engine():
    require_vllm()
    from semspec.components import embedded_draft_available
    from semspec.engine.step_engine import VLLMStepEngine

    if not embedded_draft_available():
        pytest.skip("the embedded draft is not shipped in this install")
    vllm = VLLMStepEngine.load(dtype="float32", batch_size=2, kv_cache_gb=0.5)
    yield vllm
    del vllm
    gc.collect()


@pytest.fixture(scope="module")
def reference():
    """The pair in transformers, float32: the reference for near-ties and states."""
    from semspec.components import EMBEDDED_DRAFT
    from semspec.models.loaded import load_model
    from semspec.models.specs import DEFAULT_TARGET

    return load_model(DEFAULT_TARGET, device="cpu"), load_model(EMBEDDED_DRAFT, device="cpu")


def test_the_embedded_defaults_load_and_decode(engine):
    from semspec.probes import embedded_probes_available

    assert engine.draft is not None and (engine.probes is not None) == embedded_probes_available()
    if engine.probes is None:
        pytest.skip("no probes shipped in this install")
    # the embedded head speculates tokens in the target's own writing (the writer)
    assert set(engine.identities) == {"target", "draft", "target_probe", "draft_probe", "greedy_floor",
                                      "token_draft", "dtype", "engine"}
    assert engine.writer is not None and engine.identities["token_draft"].startswith("embedded:smollm2-135m-head@")
    r = engine.generate(QUESTIONS[0], GenerationConfig(method="semspec", max_new_tokens=16, step_delimiter="\n",
                                                      max_step_tokens=8, draft_max_batch=0))
    assert r.counters.generated_tokens == 16 and r.counters.steps_drafted > 0
    assert all(0 <= s.p_target <= 1 and 0 <= s.p_draft <= 1 for s in r.steps if s.p_target is not None)


@pytest.fixture
def forced(engine):
    """Set the engine's probes to a forced pair for one test."""
    real = engine.probes

    def force(kind: str):
        engine.probes = getattr(ProbePair, f"always_{kind}")(576, 576)

    yield force
    engine.probes = real


def test_rejecting_every_step_writes_ars_text(engine, reference, forced):
    forced("reject")
    for q in QUESTIONS:
        ar = engine.generate(q, GenerationConfig(method="ar", **GREEDY))
        r = engine.generate(q, GenerationConfig(method="semspec", **GREEDY))
        assert r.counters.steps_drafted > 0 and r.counters.steps_accepted == 0
        assert all(s.author == "target" for s in r.steps)
        if r.text != ar.text:
            assert_near_tie(reference, q, r.text, ar.text)


def test_accepting_every_step_keeps_every_draft(engine, forced):
    forced("accept")
    for method in ("semspec", "step_judge"):
        r = engine.generate(QUESTIONS[0], GenerationConfig(method=method, judge_threshold=0, **GREEDY))
        drafted = [s for s in r.steps if s.decision in ("accepted", "rejected")]
        assert drafted and all(s.decision == "accepted" for s in drafted)
        assert r.counters.steps_accepted == len(drafted) == r.counters.steps_drafted
        if method == "step_judge":
            assert all(s.judge_score is not None for s in drafted)


def assert_near_tie(reference, question, text_a, text_b, gap=0.5):
    """Where two float32 greedy texts part, one of the models had the two tokens within
    ``gap`` of each other (transformers' own forward): kernels rounding apart, not a step
    taken differently."""
    from semspec.prompts import encode_prompt

    tok = reference[0].tokenizer
    a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in (text_a, text_b))
    i = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
    ids = torch.tensor([encode_prompt(tok, question) + a[:i]])
    ties = []
    for model in reference:
        with torch.no_grad():
            top = model.model(ids).logits[0, -1].float().topk(2)
        ties.append(set(top.indices.tolist()) == {a[i], b[i]} and float(top.values[0] - top.values[1]) < gap)
    assert any(ties), f"the texts part at token {i} ({a[i]} against {b[i]}), not a near-tie of either model"


def test_the_probes_read_transformers_pooled_states(engine, reference):
    """The shipped probes' features of the steps of one answer, from vLLM's stored states and
    from transformers' forward: the same to 0.01, and so the same probabilities to 0.01."""
    from semspec.probes import pool
    from semspec.stepwise import DRAFT, TARGET

    probes = engine.probes
    if probes is None:
        pytest.skip("no probes shipped in this install")
    result = engine.generate(QUESTIONS[0], GenerationConfig(method="ar", **GREEDY))
    ids = engine.new_program(QUESTIONS[0], GenerationConfig(method="ar"), lambda: 1).ids
    prompt_len = len(ids)
    ids = ids + engine.target.facts.tokenizer(result.text, add_special_tokens=False)["input_ids"]
    start = prompt_len + result.steps[0].target_tokens  # the second step on
    for role, served, model in ((TARGET, engine.target, reference[0]), (DRAFT, engine.draft, reference[1])):
        out = _states(served.llm, ids, start)
        probe = getattr(probes, role)
        with torch.no_grad():
            hidden = model.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        want = pool(hidden[probe.resolved_layer(served.shape.num_layers)][:, start:])[0]
        got = served.features(out)
        assert (got - want).abs().max() < 0.01
        assert abs(probe.predict(got) - probe.predict(want)) < 0.01


def _states(llm, ids, start):
    from vllm import SamplingParams

    from semspec.engine.states import STATES, STATES_FROM

    llm.add_request("states", llm.renderer.render_cmpl([{"prompt_token_ids": ids}])[0],
                    SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": {STATES_FROM: start}}))
    while True:
        for out in llm.step():
            if out.finished:
                return out.kv_transfer_params[STATES]

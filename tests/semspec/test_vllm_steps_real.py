"""SemanticSpec on vLLM against the embedded engine, on the embedded SmolLM2 pair (float32,
greedy): with probes forced to accept or to reject, both engines take the same decisions and
write the same text, but where a model's two best tokens are a rounding apart (vLLM keeps to
transformers' choice there, the embedded engine's own kernels may not); the states vLLM hands
the probes are transformers'."""

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
def engines():
    require_vllm()
    from semspec.components import embedded_draft_available
    from semspec.engine import Engine
    from semspec.vllm_steps import VLLMStepEngine

    if not embedded_draft_available():
        pytest.skip("the embedded draft is not shipped in this install")
    vllm = VLLMStepEngine.load(dtype="float32", batch_size=2, kv_cache_gb=0.5)
    yield vllm, Engine.load(dtype="float32")
    del vllm
    gc.collect()


@pytest.mark.parametrize("forced", ["accept", "reject"])
def test_forced_decisions_give_the_embedded_engines_text_and_steps(engines, forced):
    vllm, embedded = engines
    pair = getattr(ProbePair, f"always_{forced}")(576, 576)
    real = vllm.probes, embedded.probes
    vllm.probes = embedded.probes = pair
    try:
        for method in ("semspec", "step_judge") if forced == "accept" else ("semspec",):
            config = GenerationConfig(method=method, judge_threshold=0, **GREEDY)
            same = 0
            for q in QUESTIONS:
                a, b = vllm.generate(q, config), embedded.generate(q, config)
                assert a.counters.steps_drafted > 0 and b.counters.steps_drafted > 0
                if a.text == b.text:
                    same += 1
                    assert [(s.author, s.decision, s.target_tokens) for s in a.steps] == \
                           [(s.author, s.decision, s.target_tokens) for s in b.steps]
                else:
                    assert_near_tie(embedded, q, a.text, b.text)
            assert same >= 1
    finally:
        vllm.probes, embedded.probes = real


def assert_near_tie(embedded, question, text_a, text_b, gap=0.5):
    """Where two engines' float32 greedy texts part, one of the models had the two tokens
    within ``gap`` of each other (transformers' own forward): kernels rounding apart, not
    a step taken differently."""
    from semspec.models import encode_prompt

    tok = embedded.target.tokenizer
    a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in (text_a, text_b))
    i = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
    ids = torch.tensor([encode_prompt(tok, question) + a[:i]])
    ties = []
    for model in (embedded.target.model, embedded.draft.model):
        with torch.no_grad():
            top = model(ids).logits[0, -1].float().topk(2)
        ties.append(set(top.indices.tolist()) == {a[i], b[i]} and float(top.values[0] - top.values[1]) < gap)
    assert any(ties), f"the texts part at token {i} ({a[i]} against {b[i]}), not a near-tie of either model"


def test_the_probes_read_the_same_pooled_states_on_both_engines(engines):
    """The shipped probes' features of the steps of one answer, from vLLM's stored states and
    from transformers' forward: the same to 0.01, and so the same probabilities to 0.01."""
    from semspec.probes import pool
    from semspec.stepwise import DRAFT, TARGET

    vllm, embedded = engines
    probes = vllm.probes
    result = vllm.generate(QUESTIONS[0], GenerationConfig(method="ar", **GREEDY))
    ids = vllm.new_program(QUESTIONS[0], GenerationConfig(method="ar"), lambda: 1).ids
    prompt_len = len(ids)
    ids = ids + vllm.target.facts.tokenizer(result.text, add_special_tokens=False)["input_ids"]
    start = prompt_len + result.steps[0].target_tokens  # the second step on
    for role, served, model in ((TARGET, vllm.target, embedded.target), (DRAFT, vllm.draft, embedded.draft)):
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

    from semspec.vllm_states import STATES, STATES_FROM

    llm.add_request("states", llm.renderer.render_cmpl([{"prompt_token_ids": ids}])[0],
                    SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": {STATES_FROM: start}}))
    while True:
        for out in llm.step():
            if out.finished:
                return out.kv_transfer_params[STATES]

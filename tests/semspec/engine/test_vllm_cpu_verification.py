"""semspec.engine.vllm_cpu_verification: on vLLM's CPU build a drafted token is kept only where
it is the target's own draw for its position, so a seeded sample is the same text whatever was
drafted -- alone (drafting), beside other requests (drafting nothing: the plain sampler, as
`ar` samples), or beside a greedy request -- which vLLM's rejection sampler, taking numbers
from the request's generator per drafted position and for its residual draws, did not give."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest

from semspec.engine.token_engine import CPU_SPECULATION_MAX_BATCH, VLLMEngine
from semspec.engine.vllm_cpu_verification import emitted_tokens
from semspec.types import Request
from tests.conftest import require_vllm
from tests.semspec.engine.test_speculation import GREEDY, PROMPTS

SAMPLED = replace(GREEDY, temperature=0.8, top_p=0.95, seed=11, max_new_tokens=48)


def test_a_verification_emits_the_draws_up_to_the_first_that_differs():
    assert emitted_tokens([5, 6, 7], [5, 6, 9, 4]) == [5, 6, 9]
    assert emitted_tokens([5, 6, 7], [5, 6, 7, 4]) == [5, 6, 7, 4]  # all kept: the draw after them too
    assert emitted_tokens([5], [8, 2]) == [8]
    assert emitted_tokens([], [3]) == [3]


@pytest.fixture(scope="module")
def self_drafting(tiny_vllm_dir, tiny_cache):
    """token_sd with the tiny target drafting for itself: it keeps many of its drafts, sampled
    too, so verifications keep some and reject some."""
    require_vllm()
    eng = VLLMEngine.load(str(tiny_vllm_dir), draft=f"draft_model:{tiny_vllm_dir}", device="cpu", cache_dir=tiny_cache,
                          dtype="float32", batch_size=4, kv_cache_gb=0.25, speculative_tokens=3)
    yield eng
    del eng
    gc.collect()


def _many(engine, configs):
    requests = [Request(PROMPTS[1], config, key=i) for i, config in enumerate(configs)]
    return {d.key: d.result for d in engine.generate_many(requests, configs[0], batch_size=len(configs))}


def test_a_seeded_sample_is_the_same_drafted_or_not(self_drafting, tiny_vllm_greedy):
    from semspec.engine import vllm_cpu_verification

    assert vllm_cpu_verification.apply()
    alone = self_drafting.generate(PROMPTS[1], SAMPLED)
    c = alone.counters
    assert 0 < c.accepted_tokens < c.drafted_tokens  # kept some drafts, rejected others
    # beside others a CPU engine drafts nothing: every token from the plain sampler
    crowd = _many(self_drafting, [SAMPLED] * (CPU_SPECULATION_MAX_BATCH + 1))
    for result in crowd.values():
        assert result.counters.drafted_tokens == 0
        assert (result.text, result.finish_reason) == (alone.text, alone.finish_reason)
    # beside a greedy request, both drafting: a batch of sampled and greedy positions
    pair = _many(self_drafting, [SAMPLED, replace(GREEDY, max_new_tokens=SAMPLED.max_new_tokens)])
    assert pair[0].counters.drafted_tokens > 0 and pair[0].text == alone.text
    assert pair[1].text == tiny_vllm_greedy(PROMPTS[1], SAMPLED.max_new_tokens)[0]
    other = self_drafting.generate(PROMPTS[1], replace(SAMPLED, seed=12))
    assert other.text != alone.text

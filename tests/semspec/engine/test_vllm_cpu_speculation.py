"""semspec.engine.vllm_cpu_speculation: a token_sd engine on vLLM's CPU build, drafting only
while one request runs, takes neither the draft's pass nor the rejection sampler on the steps
where more run, drafts again once one is left, and writes the target's own text throughout."""

from __future__ import annotations

import gc
from collections import Counter
from dataclasses import replace

import pytest

from semspec.engine.token_engine import VLLMEngine
from semspec.types import Request
from tests.conftest import require_vllm
from tests.semspec.engine.test_speculation import GREEDY, PROMPTS


@pytest.fixture(scope="module")
def limited(tiny_vllm_dir, tiny_cache):
    """token_sd with the tiny target drafting for itself (it keeps nearly all it drafts where
    its cache is whole), drafting while at most one request runs."""
    require_vllm()
    eng = VLLMEngine.load(str(tiny_vllm_dir), draft=f"draft_model:{tiny_vllm_dir}", device="cpu", cache_dir=tiny_cache,
                          dtype="float32", batch_size=4, kv_cache_gb=0.25, speculative_tokens=3, draft_max_batch=1)
    yield eng
    del eng
    gc.collect()


def test_steps_beside_other_requests_skip_the_drafts_machinery(limited, tiny_vllm_greedy, monkeypatch):
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    from semspec.engine import vllm_cpu_speculation

    assert vllm_cpu_speculation.apply()
    runner = limited.llm.model_executor.driver_worker.worker.model_runner
    passes, rejections = Counter(), Counter()  # requests in the step -> calls
    propose, reject = runner.drafter.propose, RejectionSampler.forward

    def counted_propose(*args, **kwargs):
        passes[runner.input_batch.num_reqs] += 1
        return propose(*args, **kwargs)

    def counted_reject(sampler, metadata, *args, **kwargs):
        rejections[metadata.max_spec_len] += 1
        return reject(sampler, metadata, *args, **kwargs)

    monkeypatch.setattr(runner.drafter, "propose", counted_propose)
    monkeypatch.setattr(RejectionSampler, "forward", counted_reject)
    # four at once, one of them longer: it runs alone at the end (the tiny model writes no EOS)
    lengths = [60, 20, 20, 20]
    requests = [Request(prompt, replace(GREEDY, max_new_tokens=n), key=i)
                for i, (prompt, n) in enumerate(zip(PROMPTS, lengths))]
    done = {d.key: d.result for d in limited.generate_many(requests, GREEDY, batch_size=4)}
    for key, n in enumerate(lengths):  # lossless, holes in the draft's cache or not
        text, finish, _ = tiny_vllm_greedy(PROMPTS[key], n)
        assert (done[key].text, done[key].finish_reason) == (text, finish)
    # the draft's pass only where one request ran; it drafted there, and kept what it drafted
    assert set(passes) == {1} and passes[1] > 0
    assert done[0].counters.drafted_tokens > 0 and all(done[k].counters.drafted_tokens == 0 for k in (1, 2, 3))
    # the rejection sampler only on steps that verify drafted tokens
    assert rejections and 0 not in rejections

"""semspec.engine.vllm_cpu_fixes: what vLLM's CPU build gets wrong when sampling, corrected in
process: the drafted positions' sampling parameters (vllm#55005) and seeded prompts
prefilled over several engine steps."""

from __future__ import annotations

import gc

import pytest
import torch

from semspec.types import NGRAM_DRAFT, GenerationConfig, Request
from tests.conftest import require_vllm


@pytest.fixture(scope="module")
def fixed():
    require_vllm()
    from semspec.engine import vllm_cpu_fixes

    return vllm_cpu_fixes.apply()


@pytest.mark.parametrize("x", [torch.tensor([0.6, 0.25, -1.0, 1.3]), torch.tensor([5, 0, 20, 1], dtype=torch.int32)])
def test_vllms_expansion_gives_each_request_its_own_value_per_token(fixed, x):
    """The rejection sampler's per-token temperature (top-k, top-p) is the request's, repeated
    over its drafted tokens: as torch's repeat_interleave gives it."""
    from vllm.v1.sample import rejection_sampler

    counts = torch.tensor([3, 1, 4, 2])
    cu = counts.cumsum(0).to(torch.int32)
    got = rejection_sampler.expand_batch_to_tokens(x, cu, int(counts.sum()), replace_from=-1, replace_to=1)
    want = torch.repeat_interleave(torch.where(x == -1, torch.ones_like(x), x), counts)
    assert got.dtype == x.dtype and torch.equal(got, want)


def test_fixes_apply_once_and_only_where_needed(fixed):
    from semspec.engine import vllm_cpu_fixes

    assert vllm_cpu_fixes.apply() == fixed  # idempotent
    assert not vllm_cpu_fixes.expansion_is_broken()


@pytest.fixture(scope="module", params=["ar", "token_sd"])
def long_context_engine(request, tmp_path_factory, tiny_cache):
    """A tiny model with a 4k context: eight 1.8k-token prompts need several engine steps of
    vLLM's 2,048-token budget to prefill. For token_sd it drafts by ngram: in a batch of eight
    its steps draft nothing and sample through vllm_cpu_speculation's plain path, which must
    still rewind a discarded sample's generator."""
    require_vllm()
    from semspec.engine.token_engine import VLLMEngine
    from tests.tiny_models import tiny_model_dir

    path = tiny_model_dir(tmp_path_factory.mktemp("tiny-4k") / "model", hidden_size=256, seed=3, max_positions=4096)
    draft = NGRAM_DRAFT if request.param == "token_sd" else None
    eng = VLLMEngine.load(str(path), draft=draft, device="cpu", cache_dir=tiny_cache, dtype="float32", batch_size=8,
                          kv_cache_gb=0.5, speculative_tokens=4 if draft else None)
    yield eng, request.param
    del eng
    gc.collect()


def test_long_seeded_prompts_in_one_batch_sample_as_each_alone(long_context_engine):
    """Every prompt's prefill is split over steps in the batch (vLLM 0.32.0 raised "CPU
    Generator does not use offset" and failed them all); each seeded sample equals the same
    request decoded alone, prefilled whole, and a rerun of the batch."""
    eng, method = long_context_engine
    assert eng.llm.vllm_config.scheduler_config.max_num_batched_tokens < 8 * 1800
    config = GenerationConfig(method=method, max_new_tokens=12, temperature=0.6, top_p=0.95, seed=3)
    prompts = [f"word{i} " * 300 for i in range(8)]

    def batch():
        done = {d.key: d for d in eng.generate_many([Request(p, config) for p in prompts], None, batch_size=8)}
        assert [d.error for d in done.values()] == [None] * 8
        return [done[i].result.text for i in range(8)]

    first = batch()
    assert batch() == first
    assert [eng.generate(prompts[i], config).text for i in (0, 5)] == [first[0], first[5]]

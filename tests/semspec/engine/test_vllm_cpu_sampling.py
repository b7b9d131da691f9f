"""semspec.engine.vllm_cpu_sampling: top-p on vLLM's CPU build from each row's most likely
tokens, the mask vLLM's own sort gives."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import require_vllm


@pytest.fixture(scope="module")
def sorting():
    """vLLM's own top-p (the sort), whether or not the patch is in place."""
    require_vllm()
    from vllm.v1.sample.ops import topk_topp_sampler

    from semspec.engine import vllm_cpu_sampling

    vllm_cpu_sampling.apply()
    return getattr(topk_topp_sampler.apply_top_k_top_p_pytorch, "__wrapped__",
                   topk_topp_sampler.apply_top_k_top_p_pytorch)


def peaked(rows: int, vocab: int = 4096, temperature: float = 0.6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 2
    logits[:, torch.randint(0, vocab, (40,), generator=g)] += 8  # a few dozen likely tokens
    return logits / temperature


@pytest.mark.parametrize("p", [[0.95] * 5, [0.5, 0.9, 0.95, 0.99, 1.0], [1.0] * 5, [0.01] * 5])
def test_the_mask_is_vllms(sorting, p):
    from semspec.engine.vllm_cpu_sampling import top_p_without_sort

    logits = peaked(5)
    top_p = torch.tensor(p)
    mine = top_p_without_sort(logits.clone(), top_p)
    theirs = sorting(logits.clone(), None, top_p)
    assert mine is not None
    assert torch.equal(torch.isinf(mine), torch.isinf(theirs) & (logits.softmax(-1) > 0))
    assert torch.equal(mine[~torch.isinf(mine)], logits[~torch.isinf(mine)])  # kept logits unchanged
    assert (~torch.isinf(mine)).sum(-1).min() >= 1


def test_a_nucleus_wider_than_the_search_falls_back_to_vllms_sort(sorting):
    from vllm.v1.sample.ops import topk_topp_sampler

    from semspec.engine.vllm_cpu_sampling import NUCLEUS_SEARCH, top_p_without_sort

    flat = torch.zeros(2, 4 * NUCLEUS_SEARCH)
    top_p = torch.tensor([0.9, 0.9])
    assert top_p_without_sort(flat.clone(), top_p) is None
    got = topk_topp_sampler.apply_top_k_top_p_pytorch(flat.clone(), None, top_p)
    assert torch.equal(got, sorting(flat.clone(), None, top_p))


def test_top_k_stays_vllms(sorting):
    from vllm.v1.sample.ops import topk_topp_sampler

    logits, k, p = peaked(3), torch.tensor([5, 10, 20]), torch.tensor([0.9, 0.9, 0.9])
    got = topk_topp_sampler.apply_top_k_top_p_pytorch(logits.clone(), k, p)
    assert torch.equal(got, sorting(logits.clone(), k, p))


def test_a_step_without_drafts_draws_no_recovery_noise(sorting):
    """No drafted token, nothing to recover: an empty result, no seeded draw consumed; with
    drafts, vLLM's own recovery."""
    from vllm.v1.sample import rejection_sampler

    recover = rejection_sampler.sample_recovered_tokens
    assert recover.__wrapped__ is not recover
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    metadata = type("Metadata", (), {"generators": {0: generator}})()
    got = recover(0, [0, 0], torch.tensor([0, 0], dtype=torch.int32), torch.empty(0, dtype=torch.int64), None,
                  torch.empty(0, 16), metadata, torch.device("cpu"))
    assert got.numel() == 0 and torch.equal(generator.get_state(), state)

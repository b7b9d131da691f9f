"""semspec.engine.vllm_cpu_sampling: top-p on vLLM's CPU build from each row's most likely
tokens, the mask vLLM's own sort gives; sampling by inversion from the law vLLM samples from,
each seeded row from its own generator."""

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


def nucleus_law(logits: torch.Tensor, p: float, sorting) -> torch.Tensor:
    """The law vLLM samples a row from: softmax over its top-p mask (its own sort)."""
    masked = sorting(logits.clone(), None, torch.full((logits.shape[0],), p))
    return masked.softmax(-1)


@pytest.mark.parametrize("p", [0.9, 1.0])
def test_inversion_draws_from_vllms_law(sorting, p):
    """20,000 draws of one row: every token's frequency within 0.01 of vLLM's probability, none
    outside the nucleus, none of a masked (-inf) token."""
    from semspec.engine.vllm_cpu_sampling import row_uniforms, sample_rows

    logits = peaked(1, vocab=64, temperature=1.0) / 3
    logits[0, :4] = float("-inf")  # e.g. a token a request forbids
    law = nucleus_law(logits, p, sorting)[0]
    draws = 20_000
    batch = logits.expand(draws, -1).contiguous()
    top_p = None if p == 1.0 else torch.full((draws,), p)
    tokens = sample_rows(batch, top_p, lambda: row_uniforms(draws, {}))
    freq = torch.bincount(tokens, minlength=64).double() / draws
    assert (freq - law.double()).abs().max() < 0.01
    assert bool((freq[law == 0] == 0).all())


def test_a_row_wider_than_a_block_inverts_over_blocks_then_within_one(sorting):
    """The two-level inversion of a wide row (three blocks and a short one): vLLM's law, masked
    tokens never, and the draw at either end of [0, 1) a positive weight's."""
    from semspec.engine.vllm_cpu_sampling import INVERSION_BLOCK, inverse_cdf, row_uniforms, sample_rows

    vocab = 3 * INVERSION_BLOCK + 17
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(1, vocab, generator=g)
    likely = torch.tensor([3, INVERSION_BLOCK - 1, INVERSION_BLOCK, 2 * INVERSION_BLOCK + 5, vocab - 1])
    logits[0, likely] += 4
    logits[0, [0, INVERSION_BLOCK + 1, vocab - 2]] = float("-inf")
    law = logits.softmax(-1)[0].double()
    draws = 40_000
    tokens = sample_rows(logits.expand(draws, -1).contiguous(), None, lambda: row_uniforms(draws, {}))
    freq = torch.bincount(tokens, minlength=vocab).double() / draws
    assert (freq - law).abs().max() < 0.01 and bool((freq[law == 0] == 0).all())
    # the ends: the first and the last token of positive weight
    weights = torch.zeros(2, vocab)
    weights[:, [7, vocab - 3]] = 1.0
    assert inverse_cdf(weights, torch.tensor([0.0, 1.0 - 1e-12])).tolist() == [7, vocab - 3]


def test_rows_of_either_kind_in_one_batch(sorting):
    """A batch mixing top-p rows and whole-vocabulary rows: each row from its own law."""
    from semspec.engine.vllm_cpu_sampling import row_uniforms, sample_rows

    rows = peaked(2, vocab=64, temperature=1.0, seed=5) / 3
    draws = 10_000
    batch = rows.repeat(draws, 1)
    top_p = torch.tensor([0.8, 1.0]).repeat(draws)
    tokens = sample_rows(batch, top_p, lambda: row_uniforms(2 * draws, {})).view(draws, 2)
    for r, p in enumerate((0.8, 1.0)):
        law = nucleus_law(rows[r:r + 1], p, sorting)[0].double()
        freq = torch.bincount(tokens[:, r], minlength=64).double() / draws
        assert (freq - law).abs().max() < 0.015


def test_a_seeded_row_draws_the_same_token_however_it_is_batched(sorting):
    from semspec.engine.vllm_cpu_sampling import row_uniforms, sample_rows

    logits = peaked(4)
    top_p = torch.tensor([0.95, 0.95, 1.0, 0.9])

    def alone(row: int, seed: int) -> int:
        gen = {0: torch.Generator().manual_seed(seed)}
        return int(sample_rows(logits[row:row + 1].clone(), top_p[row:row + 1], lambda: row_uniforms(1, gen))[0])

    for seed in range(5):
        generators = {i: torch.Generator().manual_seed(seed + i) for i in range(4)}
        batched = sample_rows(logits.clone(), top_p, lambda: row_uniforms(4, generators))
        assert batched.tolist() == [alone(i, seed + i) for i in range(4)]


def test_a_nucleus_too_wide_to_invert_draws_nothing(sorting):
    """sample_rows gives up before drawing: the generator is untouched for vLLM's own path."""
    from semspec.engine.vllm_cpu_sampling import NUCLEUS_SEARCH, row_uniforms, sample_rows

    generator = torch.Generator().manual_seed(7)
    state = generator.get_state()
    flat = torch.zeros(1, 4 * NUCLEUS_SEARCH)
    assert sample_rows(flat, torch.tensor([0.9]), lambda: row_uniforms(1, {0: generator})) is None
    assert torch.equal(generator.get_state(), state)


@pytest.mark.parametrize("case", ["top-p", "whole", "top-k", "processed logprobs"])
def test_vllms_cpu_sampler_samples_by_inversion_where_it_can(sorting, monkeypatch, case):
    """vLLM's sampler module on a CPU: top-p or the whole vocabulary by inversion (the seeded
    row's token is the one its generator draws by inversion); top-k, or a sampler that returns
    its masked log-probabilities, through vLLM's own Gumbel kernel."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    from semspec.engine import vllm_cpu_sampling

    mode = "processed_logprobs" if case == "processed logprobs" else "raw_logprobs"
    sampler = TopKTopPSampler(logprobs_mode=mode)
    inverted, invert = [], vllm_cpu_sampling.sample_rows
    monkeypatch.setattr(vllm_cpu_sampling, "sample_rows", lambda *a: inverted.append(1) or invert(*a))
    logits = peaked(2)
    k = torch.tensor([5, 5]) if case == "top-k" else None
    p = torch.tensor([0.95, 0.95]) if case in ("top-p", "top-k") else None
    generators = {1: torch.Generator().manual_seed(11)}
    tokens, _ = sampler(logits.clone(), generators, k, p)
    assert tokens.shape == (2,) and bool(inverted) is (case in ("top-p", "whole"))
    if inverted:
        again = invert(logits[1:].clone(), None if p is None else p[1:],
                       lambda: vllm_cpu_sampling.row_uniforms(1, {0: torch.Generator().manual_seed(11)}))
        assert int(tokens[1]) == int(again[0])

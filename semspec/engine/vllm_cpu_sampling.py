"""Sampling on vLLM's CPU build without work no sampled token needs, applied in the process that
runs an engine (``start_engine``; the ``vllm.general_plugins`` entry point in engine processes
vLLM starts itself). Both changes leave every token as vLLM draws it.

**Top-p without a sort of the vocabulary.**
Without Triton vLLM applies top-p (``apply_top_k_top_p_pytorch``, 0.32.0) by sorting every
row's logits over the whole vocabulary: 2.7 ms a row for SmolLM2's 49,152 tokens on a 2-core
CPU, once per sampled token and again per drafted position when speculating. At T 0.6,
top-p 0.95 that was 27% of a draft pass, and at 32 in flight ``ar`` made 261 tok/s against
461 greedy (32 in flight, a 2-core AVX-512 host). Sampled datasets are what semjobs makes, so here the nucleus
is found among each row's most likely ``NUCLEUS_SEARCH`` tokens (``topk``); the mask is the
one vLLM's sort gives (a token is kept while the probability above it is under p; at least
the most likely one), and a call where some row's nucleus is wider falls back to vLLM's own
function. Rows with top-k, and GPU builds (Triton or FlashInfer kernels), are left to vLLM.

**One uniform draw per sampled token, not a Gumbel noise per vocabulary entry.**
vLLM's CPU sampler (``TopKTopPSampler.forward_cpu``, 0.32.0) hashes a Gumbel noise for every
token of the vocabulary of every row (``fused_gumbel_argmax``): 5.4 ms a step at 32 rows of
SmolLM2's 49,152 tokens on two threads (of a 30-40 ms ``ar`` step), 4.2 ms with top-p 0.95
and its search; 1.5 and 2.3 ms here (what that moves in a run: docs/benchmarks.md, "What the
CPU patches of vLLM buy"). A row is sampled by inversion: one
uniform number from the row's generator (a seeded request's own, so a seeded sample stays the
same however it is batched), and the first token whose cumulative probability passes it. With
top-p the nucleus is found among each row's ``NUCLEUS_FIRST`` most likely tokens, or
``NUCLEUS_SEARCH``, and the inversion runs over it alone; wider than that, or with top-k,
vLLM's own path. The law of each token is the one vLLM samples from; the token a given seed
draws is not vLLM's.

**No recovery noise for a step that verifies no drafted token.** An engine with a speculative
method runs every sampled step through the rejection sampler, drafts or not; it draws an
exponential noise row over the vocabulary per request for recovering rejected drafts
(``sample_recovered_tokens``) even when no request has one, which a seeded request's
generator is spared anyway. The step engine's target stores probe states through
``extract_hidden_states``, a speculative method that drafts nothing: that noise cost it 3 ms
of a 30 ms step at 4 in flight (semspec paused for the batch made 0.84x ``ar`` at T 0.6).

**No processed log-probabilities nobody asked for.** An engine started with
``logprobs_mode="processed_logprobs"`` (the step engine's target: a judge reads the ten digits'
log-probabilities after the allowed-token mask) computes a log-softmax over the vocabulary for
every row of every step; now only for a step in which some request asks for log-probabilities.
"""

from __future__ import annotations

import functools

import torch

# candidates searched for the nucleus: at the temperatures datasets are sampled at it holds a
# few dozen tokens (first look among NUCLEUS_FIRST: a smaller top-k is a cheaper scan); a wider
# one (a flat distribution) takes vLLM's sort
NUCLEUS_FIRST = 32
NUCLEUS_SEARCH = 256
# a row of the whole vocabulary is inverted over blocks of this many tokens, then within one
INVERSION_BLOCK = 256
_applied = False


def top_p_without_sort(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor | None:
    """``logits`` with every token outside its row's top-p nucleus (:func:`nucleus`) at -inf (in
    place), or None when some row's nucleus is wider than ``NUCLEUS_SEARCH`` tokens. Rows with
    p >= 1 keep all."""
    cut = (p < 1.0).cpu()
    if not bool(cut.any()):
        return logits
    every = bool(cut.all())
    rows = None if every else cut.nonzero().squeeze(1)
    some = logits if every else logits[rows]
    parts = nucleus(some.softmax(dim=-1, dtype=torch.float32), p if every else p[rows], NUCLEUS_SEARCH)
    if parts is None:
        return None
    kept, index = parts
    values = some.gather(-1, index).masked_fill_(kept == 0, float("-inf"))
    some.fill_(float("-inf")).scatter_(-1, index, values)
    if not every:
        logits[rows] = some
    return logits


def nucleus(probs: torch.Tensor, p: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's top-p nucleus among its ``width`` most likely tokens: (their probabilities,
    zero outside the nucleus; their token ids), most likely first; None when some row's nucleus
    is wider. The nucleus is vLLM's: a token is kept while the probability above it is under p,
    the most likely one always."""
    top, index = probs.topk(min(width, probs.shape[-1]), dim=-1)
    limit = p.to(torch.float32).unsqueeze(1)
    if not bool((top.sum(-1, keepdim=True) >= limit).all()):
        return None
    above = top.cumsum(-1) - top
    return top.masked_fill_(above >= limit, 0.0), index


def inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Per row, the position whose cumulative weight first passes ``uniform`` (in [0, 1)) times
    the row's total: a draw from the weights' law (zero weights are never drawn). Cumulative sums
    run in float64, a row wider than ``INVERSION_BLOCK`` in two levels: the block the draw falls
    in from the blocks' sums, then the position within it (a cumulative sum of the whole
    vocabulary per row in float64 cost more than the sampling it replaces)."""
    width = weights.shape[-1]
    u = uniform.to(torch.float64)
    if width <= INVERSION_BLOCK:
        return _first_past(weights.to(torch.float64).cumsum(-1), u)
    whole = width // INVERSION_BLOCK * INVERSION_BLOCK
    # a block's sum in the weights' float32 (a relative error near 1e-7, as vLLM's float32 noise
    # has; summing in float64 took 0.7 ms of a 32-row step here, float32 0.25)
    sums = weights[:, :whole].unflatten(-1, (-1, INVERSION_BLOCK)).sum(-1).to(torch.float64)
    if whole < width:
        sums = torch.cat([sums, weights[:, whole:].sum(-1, keepdim=True).to(torch.float64)], dim=1)
    cumulative = sums.cumsum(-1)
    target = u * cumulative[:, -1]
    block = _first_past(cumulative, u).unsqueeze(1)
    start = block * INVERSION_BLOCK
    offsets = torch.arange(INVERSION_BLOCK).unsqueeze(0)
    inside = weights.gather(1, (start + offsets).clamp_(max=width - 1)).to(torch.float64)
    inside.masked_fill_(start + offsets >= width, 0.0)  # the last block's positions past the row
    within = target - (cumulative.gather(1, block) - sums.gather(1, block)).squeeze(1)
    local = inside.cumsum(-1)
    drawn = _first_past(local, within / local[:, -1])
    # a draw that rounding carried past the block's last positive weight takes that weight
    last = torch.where(inside > 0, offsets, 0).amax(-1)
    return start.squeeze(1) + torch.minimum(drawn, last)


def _first_past(cumulative: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first position whose cumulative weight is above ``u`` times the row's total."""
    target = (u * cumulative[:, -1]).unsqueeze(1)
    return torch.searchsorted(cumulative, target, right=True).squeeze(1).clamp_(max=cumulative.shape[-1] - 1)


def sample_rows(logits: torch.Tensor, p: torch.Tensor | None, uniforms) -> torch.Tensor | None:
    """A token per row of ``logits`` (temperature applied), within top-p ``p`` (None, or a row's
    p >= 1: the whole vocabulary), by inversion at the uniform numbers ``uniforms()`` returns
    (called once, only when the rows can be sampled here); None when some row's nucleus is
    wider than ``NUCLEUS_SEARCH`` tokens (nothing drawn then)."""
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    cut = None if p is None else (p < 1.0).cpu()
    if cut is None or not bool(cut.any()):
        return inverse_cdf(probs, uniforms())
    rows = cut.nonzero().squeeze(1)
    some = probs if bool(cut.all()) else probs[rows]
    parts = nucleus(some, p[rows], NUCLEUS_FIRST) or nucleus(some, p[rows], NUCLEUS_SEARCH)
    if parts is None:
        return None
    u = uniforms()
    # inverted in vocabulary order, not by likelihood: two near-tied tokens whose order a
    # rounding difference swaps (a batch of other rows) would swap which one a draw lands on
    # (seeded ar reruns, 32 in flight, ~400-token prompts: 12 of 32 the same by likelihood, 32 of
    # 32 in vocabulary order, 24 with vLLM's noise)
    index, order = parts[1].sort(dim=-1)
    weights = parts[0].gather(1, order)
    tokens = torch.empty(probs.shape[0], dtype=torch.long)
    tokens[rows] = index.gather(1, inverse_cdf(weights, u[rows]).unsqueeze(1)).squeeze(1)
    whole = (~cut).nonzero().squeeze(1)
    if len(whole):
        tokens[whole] = inverse_cdf(probs[whole], u[whole])
    return tokens


def row_uniforms(rows: int, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """A uniform number in [0, 1) per row: a seeded request's from its own generator (one draw
    per sampled token, as vLLM's sampler takes one), the others' from torch's."""
    u = torch.rand(rows, dtype=torch.float64)
    for i, generator in generators.items():
        u[i] = torch.rand(1, dtype=torch.float64, generator=generator)
    return u


def apply() -> bool:
    """Sample by inversion (:func:`sample_rows`), route vLLM's other CPU top-p through
    :func:`top_p_without_sort` and skip the recovery noise of steps without drafts (idempotent);
    whether it did."""
    global _applied
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    shaped = all(hasattr(module, name) for module, name in (
        (topk_topp_sampler, "apply_top_k_top_p_pytorch"), (rejection_sampler, "sample_recovered_tokens"),
        (getattr(topk_topp_sampler, "TopKTopPSampler", None), "forward_cpu")))
    if _applied or not current_platform.is_cpu() or getattr(topk_topp_sampler, "HAS_TRITON", True) or not shaped:
        return _applied  # a GPU build, or a vLLM whose sampler is not the one this was written for
    sorting = topk_topp_sampler.apply_top_k_top_p_pytorch
    recovering = rejection_sampler.sample_recovered_tokens

    @functools.wraps(recovering)
    def sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, *args,
                                **kwargs):
        if not any(num_draft_tokens):  # nothing to recover: no draw a token depends on
            return torch.empty_like(draft_token_ids)
        return recovering(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, *args, **kwargs)

    @functools.wraps(sorting)
    def apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=False):
        if p is not None and k is None and logits.dim() == 2:
            masked = top_p_without_sort(logits, p)
            if masked is not None:
                return masked
        return sorting(logits, k, p, allow_cpu_sync)

    topk_topp_sampler.apply_top_k_top_p_pytorch = apply_top_k_top_p_pytorch
    rejection_sampler.sample_recovered_tokens = sample_recovered_tokens
    _sample_by_inversion(topk_topp_sampler.TopKTopPSampler)
    _skip_unasked_logprobs()
    _applied = True
    return True


def _sample_by_inversion(sampler_class) -> None:
    """``sampler_class.forward_cpu`` through :func:`sample_rows` where it can (samplers bind it
    as they are built: this runs before any engine is)."""
    forward = sampler_class.forward_cpu

    @functools.wraps(forward)
    def forward_cpu(self, logits, generators, k, p):
        processed = str(self.logprobs_mode).startswith("processed")  # returns the masked logits
        if k is None and not processed and not self.use_fp64_gumbel and logits.dim() == 2:
            tokens = sample_rows(logits, p, lambda: row_uniforms(logits.shape[0], generators))
            if tokens is not None:
                return tokens, None
        return forward(self, logits, generators, k, p)

    sampler_class.forward_cpu = forward_cpu


def _skip_unasked_logprobs() -> None:
    from vllm.v1.sample.sampler import Sampler

    forward = Sampler.forward

    @functools.wraps(forward)
    def sampler_forward(self, logits, sampling_metadata, *args, **kwargs):
        asked = sampling_metadata.max_num_logprobs is not None or getattr(sampling_metadata, "logprob_token_ids", None)
        if asked or not str(self.logprobs_mode).startswith("processed") \
                or not hasattr(self.topk_topp_sampler, "logprobs_mode"):
            return forward(self, logits, sampling_metadata, *args, **kwargs)
        inner = self.topk_topp_sampler
        modes = self.logprobs_mode, inner.logprobs_mode
        self.logprobs_mode = inner.logprobs_mode = "raw_logprobs"  # computes none unless asked
        try:
            return forward(self, logits, sampling_metadata, *args, **kwargs)
        finally:
            self.logprobs_mode, inner.logprobs_mode = modes

    Sampler.forward = sampler_forward

"""Sampling on vLLM's CPU build without work no sampled token needs, applied in the process that
runs an engine (``start_engine``; the ``vllm.general_plugins`` entry point in engine processes
vLLM starts itself). Both changes leave every token as vLLM draws it.

**Top-p without a sort of the vocabulary.**
Without Triton vLLM applies top-p (``apply_top_k_top_p_pytorch``, 0.32.0) by sorting every
row's logits over the whole vocabulary: 2.7 ms a row for SmolLM2's 49,152 tokens on a 2-core
CPU, once per sampled token and again per drafted position when speculating. At T 0.6,
top-p 0.95 that was 27% of a draft pass, and at 32 in flight ``ar`` made 261 tok/s against
461 greedy (docs/benchmarks.md). Sampled datasets are what semjobs makes, so here the nucleus
is found among each row's most likely ``NUCLEUS_SEARCH`` tokens (``topk``); the mask is the
one vLLM's sort gives (a token is kept while the probability above it is under p; at least
the most likely one), and a call where some row's nucleus is wider falls back to vLLM's own
function. Rows with top-k, and GPU builds (Triton or FlashInfer kernels), are left to vLLM.

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
# few dozen tokens; a wider one (a flat distribution) takes vLLM's sort
NUCLEUS_SEARCH = 256
_applied = False


def top_p_without_sort(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor | None:
    """``logits`` with every token outside its row's top-p nucleus at -inf (in place), or None
    when some row's nucleus is wider than ``NUCLEUS_SEARCH`` tokens. Rows with p >= 1 keep all."""
    width = min(NUCLEUS_SEARCH, logits.shape[-1])
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    top, index = probs.topk(width, dim=-1)
    limit = p.to(torch.float32).unsqueeze(1)
    whole = limit >= 1.0
    if not bool(((top.sum(-1, keepdim=True) >= limit) | whole).all()):
        return None
    above = top.cumsum(-1) - top  # the probability of the more likely tokens
    values = logits.gather(-1, index).masked_fill_(above >= limit, float("-inf"))
    if bool(whole.any()):
        rows = ~whole.squeeze(1)
        logits[rows] = torch.full_like(logits[rows], float("-inf")).scatter_(-1, index[rows], values[rows])
        return logits
    return logits.fill_(float("-inf")).scatter_(-1, index, values)


def apply() -> bool:
    """Route vLLM's CPU top-p through :func:`top_p_without_sort` and skip the recovery noise of
    steps without drafts (idempotent); whether it did."""
    global _applied
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    shaped = all(hasattr(module, name) for module, name in (
        (topk_topp_sampler, "apply_top_k_top_p_pytorch"), (rejection_sampler, "sample_recovered_tokens")))
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
    _skip_unasked_logprobs()
    _applied = True
    return True


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

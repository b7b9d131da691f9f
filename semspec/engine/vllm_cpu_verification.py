"""Drafted tokens verified by the draw the target would make alone, on vLLM's CPU build; applied
in the process that runs an engine (``start_engine``; the ``vllm.general_plugins`` entry point
in engine processes vLLM starts itself).

vLLM's rejection sampler (0.32.0) keeps a drafted token x with probability p(x) / q(x) against a
uniform number drawn per drafted position, and replaces a rejected one by a draw from the
residual made with an exponential noise over the vocabulary; a seeded request's generator
feeds all of it, so how many numbers a step takes from it depends on what was drafted. Drafts
depend on the batch (a CPU engine drafts only while few requests run, and the draft's cache
then has holes): seeded `token_sd` reruns at 32 in flight wrote the same text for 24 of 32
samples, and never `ar`'s for the same seed.

Here, for drafts that come without probabilities (one-hot: the head's argmax, which
``semspec.engine.speculation`` asks for, ngram, suffix), every position -- each drafted one and
the one after them -- is sampled as the target alone samples it
(``semspec.engine.vllm_cpu_sampling.sample_rows``, by inversion at the next uniform number of
the request's generator), and a drafted token is kept while it is that draw; the first draw
that differs, or the one after the last drafted token, is the target's token there. Only the
emitted tokens' numbers are taken from the generator, one each, as `ar` takes them. The law is
the rejection sampler's (x is kept with probability p(x); a rejected one is replaced by a draw
from p without x), and a seeded sample is the same text whatever was drafted: `ar`'s for that
seed, up to the rounding of other batch shapes. The logits are processed as vLLM processes
them (its logits processors, penalties, temperature; like vLLM, min_p and logit_bias reach the
position after the drafts only, so requests with those are the same drafted or not only where
vLLM's would be); probabilistic drafts, top-k, log-probabilities, float64 noise and a nucleus
wider than ``sample_rows`` searches are left to vLLM.
"""

from __future__ import annotations

import functools

import torch

from semspec.engine.vllm_cpu_sampling import sample_rows

_applied = False


def emitted_tokens(drafted: list[int], drawn: list[int]) -> list[int]:
    """A request's tokens for one verification: its draws (one per drafted position and one
    after) up to the first that differs from the drafted token, that one included."""
    kept = 0
    while kept < len(drafted) and drawn[kept] == drafted[kept]:
        kept += 1
    return drawn[:kept + 1]


def apply() -> bool:
    """Verify one-hot drafts by the target's own draws (idempotent); whether it does."""
    global _applied
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler
    from vllm.v1.sample.sampler import Sampler

    shaped = hasattr(rejection_sampler, "PLACEHOLDER_TOKEN_ID") and all(
        hasattr(cls, name) for cls, name in ((rejection_sampler.RejectionSampler, "apply_logits_processors"),
                                             (Sampler, "apply_logits_processors"), (Sampler, "apply_temperature"),
                                             (Sampler, "greedy_sample")))
    if _applied or not current_platform.is_cpu() or getattr(topk_topp_sampler, "HAS_TRITON", True) or not shaped:
        return _applied
    _verify_by_draws(rejection_sampler.RejectionSampler, rejection_sampler.PLACEHOLDER_TOKEN_ID)
    _applied = True
    return True


def _verify_by_draws(sampler_class, placeholder: int) -> None:
    forward = sampler_class.forward

    @functools.wraps(forward)
    def forward_(self, metadata, draft_probs, logits, sampling_metadata):
        m = sampling_metadata
        if draft_probs is not None or getattr(self, "synthetic_mode", False) or m.all_greedy \
                or getattr(self, "use_fp64_gumbel", False) \
                or m.top_k is not None or m.max_num_logprobs is not None or m.logprob_token_ids:
            return forward(self, metadata, draft_probs, logits, sampling_metadata)
        counts = list(metadata.num_draft_tokens)
        rows, greedy, top_p = _positions(self, metadata, counts, logits, m)
        generators = m.generators
        saved = {r: g.get_state() for r, g in generators.items()}

        def uniforms() -> torch.Tensor:  # each request's next numbers, one per position
            u = torch.rand(len(rows), dtype=torch.float64)
            start = 0
            for r, k in enumerate(counts):
                if r in generators:
                    u[start:start + k + 1] = torch.rand(k + 1, dtype=torch.float64, generator=generators[r])
                start += k + 1
            return u

        drawn = sample_rows(rows, top_p, uniforms)
        if drawn is None:  # a nucleus wider than sample_rows searches: nothing was drawn
            return forward(self, metadata, draft_probs, logits, sampling_metadata)
        drawn = torch.where(greedy, self.sampler.greedy_sample(rows).long(), drawn).tolist()
        drafts = metadata.draft_token_ids.tolist()
        out = torch.full((len(counts), metadata.max_spec_len + 1), placeholder, dtype=torch.int32)
        start = drafted = 0
        for r, k in enumerate(counts):
            tokens = emitted_tokens(drafts[drafted:drafted + k], drawn[start:start + k + 1])
            out[r, :len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
            if r in generators:  # the numbers of the emitted tokens only were taken
                generators[r].set_state(saved[r])
                torch.rand(len(tokens), dtype=torch.float64, generator=generators[r])
            start, drafted = start + k + 1, drafted + k
        from vllm.v1.outputs import SamplerOutput

        return SamplerOutput(sampled_token_ids=out, logprobs_tensors=None)

    sampler_class.forward = forward_


def _positions(rejecter, metadata, counts: list[int], logits: torch.Tensor, m):
    """Every position's processed logits, each request's drafted positions then the one after
    them, as vLLM prepares them for sampling (the plain sampler's processing for the position
    after, the rejection sampler's for drafted ones, temperature applied); with which are
    greedy, and each one's top-p (or None)."""
    from vllm.v1.sample.sampler import _SAMPLING_EPS, Sampler

    after = logits[metadata.bonus_logits_indices].to(torch.float32)
    after = rejecter.sampler.apply_logits_processors(after, m, predict_bonus_token=True)
    after = Sampler.apply_temperature(after, m.temperature, m.all_random)
    for processor in m.logitsprocs.argmax_invariant:
        after = processor.apply(after)
    drafted = logits[metadata.target_logits_indices].to(torch.float32)
    drafted = rejecter.apply_logits_processors(drafted, m, metadata)
    per_position = torch.tensor(counts) + 1
    owner = torch.repeat_interleave(torch.arange(len(counts)), per_position)
    is_after = torch.zeros(len(owner), dtype=torch.bool)
    is_after[torch.cumsum(per_position, 0) - 1] = True  # each request's last position
    rows = torch.empty((len(owner), logits.shape[-1]), dtype=torch.float32)
    rows[is_after] = after
    temperature = m.temperature.to(torch.float32)
    greedy = temperature[owner] < _SAMPLING_EPS
    rows[~is_after] = drafted / torch.where(greedy, 1.0, temperature[owner])[~is_after].unsqueeze(1)
    top_p = None if m.top_p is None else m.top_p[owner]
    return rows, greedy, top_p

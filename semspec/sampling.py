"""Sampling outside vLLM: a distribution from logits (temperature, top-p, greedy) for
transformers' calibration fallback, and the seeded coin semspec's acceptance tosses."""

from __future__ import annotations

import torch


# The nucleus is almost always a few dozen tokens: look for it among the top candidates
# first, since a full sort of a 49k vocabulary costs several ms per token on a CPU (a large
# share of a small draft's step). The result is the same as with the full sort.
_NUCLEUS_CANDIDATES = 256


def probs_from_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution over the last dim (float32). Greedy (temperature 0) is a
    one-hot on the argmax, so speculative-sampling formulas reduce to exact matching."""
    logits = logits.float()
    if temperature <= 0:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    p = torch.softmax(logits / temperature, dim=-1)
    if top_p >= 1.0:
        return p
    k = min(_NUCLEUS_CANDIDATES, p.shape[-1])
    top_p_vals, idx = torch.topk(p, k, dim=-1)
    if k == p.shape[-1] or bool((top_p_vals.sum(-1) > top_p).all()):
        sorted_p = top_p_vals
    else:
        sorted_p, idx = torch.sort(p, dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    drop = cum - sorted_p > top_p  # keep the smallest prefix whose mass reaches top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    p = torch.zeros_like(p).scatter_(-1, idx, sorted_p)
    return p / p.sum(-1, keepdim=True)


def uniform(generator: torch.Generator | None, device="cpu") -> float:
    return float(torch.rand((), generator=generator, device=device))


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g

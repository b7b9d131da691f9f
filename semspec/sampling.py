"""Turning logits into tokens: temperature, top-p, greedy, seeded sampling."""

from __future__ import annotations

import torch


def probs_from_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution over the last dim (float32). Greedy (temperature 0) is a
    one-hot on the argmax, so speculative-sampling formulas reduce to exact matching."""
    logits = logits.float()
    if temperature <= 0:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    p = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, idx = torch.sort(p, dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = cum - sorted_p > top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        p = torch.zeros_like(p).scatter_(-1, idx, sorted_p)
        p = p / p.sum(-1, keepdim=True)
    return p


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a 1-D distribution."""
    if probs.max() >= 1.0:
        return int(probs.argmax())
    return int(torch.multinomial(probs, 1, generator=generator)[0])


def sample_logits(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits.argmax(-1))
    return sample(probs_from_logits(logits, temperature, top_p), generator)


def uniform(generator: torch.Generator | None, device="cpu") -> float:
    return float(torch.rand((), generator=generator, device=device))


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g

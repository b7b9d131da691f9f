"""Turning logits into tokens: temperature, top-p, greedy, seeded sampling."""

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


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token id per row of ``probs`` [R, V], by inverse CDF on one uniform per row taken
    from that row's own generator: a row draws the same token whatever other rows share the
    call, so outputs do not depend on the batch."""
    u = torch.stack([torch.rand((), generator=g, device=probs.device) for g in generators])
    cum = probs.cumsum(-1)
    x = (u * cum[:, -1]).unsqueeze(-1)
    # right=True: the first index whose cumulative mass exceeds x, which has mass of its own
    return torch.searchsorted(cum, x, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a 1-D distribution."""
    return int(draw(probs[None], [generator])[0])


def sample_rows(logits: torch.Tensor, samples) -> list[int]:
    """The next token of every row of ``logits`` [R, V] under its own :class:`Sample`
    (temperature, top-p, generator): greedy rows in one argmax, sampled rows grouped by
    their settings, one host transfer at the end."""
    out = torch.empty(len(samples), dtype=torch.long, device=logits.device)
    groups: dict[tuple[float, float], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault((s.temperature, s.top_p) if s.temperature > 0 else (0.0, 1.0), []).append(i)
    for (temperature, top_p), rows in groups.items():
        idx = torch.tensor(rows, device=logits.device)
        if temperature <= 0:
            out[idx] = logits[idx].argmax(-1)
        else:
            probs = probs_from_logits(logits[idx], temperature, top_p)
            out[idx] = draw(probs, [samples[i].generator for i in rows])
    return out.tolist()


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

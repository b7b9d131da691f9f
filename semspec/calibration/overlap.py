"""How much the draft's step meanings overlap the target's, from the labelled samples.

Speculative sampling over meanings accepts a drafted step with probability min(1, p_T/p_D);
averaged over the draft's steps that is the overlap of the two meaning distributions,
sum over meanings of min(p_T, p_D) -- the acceptance rate of the rule with perfect probes.

With N samples per model the empirical overlap is biased low (two samples of the same
distribution rarely land on identical meaning counts), so it is reported beside the
target's overlap with *itself*: the target's samples are split in two halves, and the
draft is compared with each half at the same sample size. ``relative`` is the draft's
overlap over the target's own: 1.0 would be a draft that says what the target says as
often as the target does.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence


def empirical_overlap(a: Sequence[int], b: Sequence[int]) -> float:
    """sum over clusters of min(share in a, share in b): 1 - the total variation distance
    between the two samples' cluster frequencies."""
    if not a or not b:
        raise ValueError("both samples must be non-empty")
    ca, cb = Counter(a), Counter(b)
    return sum(min(ca[m] / len(a), cb[m] / len(b)) for m in ca.keys() & cb.keys())


def meaning_overlap(prefixes: Iterable[tuple[Sequence[int], Sequence[str]]]) -> dict:
    """Mean overlaps over prefixes, each given as (cluster id per sample, source per sample:
    "target"/"draft"). Prefixes with fewer than 2 target or 1 draft sample are skipped."""
    self_halves, draft_halves, full = [], [], []
    for clusters, sources in prefixes:
        t = [c for c, s in zip(clusters, sources) if s == "target"]
        d = [c for c, s in zip(clusters, sources) if s == "draft"]
        if len(t) < 2 or not d:
            continue
        h = len(t) // 2
        t1, t2 = t[:h], t[h:2 * h]
        d1, d2 = d[:h] or d, d[h:2 * h] or d
        self_halves.append(empirical_overlap(t1, t2))
        draft_halves.append(sum(empirical_overlap(x, y) for x in (d1, d2) for y in (t1, t2)) / 4)
        full.append(empirical_overlap(d, t))
    if not full:
        raise ValueError("no prefix has both target and draft samples")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    target_self, draft_target = mean(self_halves), mean(draft_halves)
    return {
        "prefixes": len(full),
        "half_sample_size": len(t1),
        "target_self": target_self,
        "draft_target": draft_target,
        "relative": draft_target / target_self if target_self > 0 else None,
        "draft_target_all_samples": mean(full),
    }

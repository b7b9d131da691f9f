"""How right a job's answers are, when its inputs carried references: accuracy over samples,
pass@k over each input's samples and majority-vote accuracy (self-consistency).

Every figure is over the inputs with a reference (outputs whose `correct` is not NULL).
pass@k is the unbiased estimator of Chen et al. (2021): over an input's n samples of which
c are correct, 1 - C(n-c, k) / C(n, k), averaged over inputs with at least k samples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import comb
from typing import Iterable


@dataclass
class Answer:
    input_id: str
    sample: int
    final_answer: str | None
    correct: bool | None


def majority(answers: list[Answer]) -> Answer | None:
    """The first sample giving the answer most samples of one input give (ties: the answer
    an earlier sample gave first); None when no sample has an answer."""
    found = sorted((a for a in answers if a.final_answer is not None), key=lambda a: a.sample)
    if not found:
        return None
    votes = Counter(a.final_answer for a in found)
    top = max(votes.values())
    return next(a for a in found if votes[a.final_answer] == top)


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def by_input(answers: Iterable[Answer]) -> dict[str, list[Answer]]:
    groups: dict[str, list[Answer]] = {}
    for a in answers:
        groups.setdefault(a.input_id, []).append(a)
    return groups


def summary(answers: Iterable[Answer]) -> dict | None:
    """Accuracy, pass@1 and pass@k (k: the most samples any input has) and majority-vote
    accuracy; None when no output was checked against a reference."""
    groups = by_input(a for a in answers if a.correct is not None)
    if not groups:
        return None
    checked = [a for g in groups.values() for a in g]
    k_max = max(len(g) for g in groups.values())
    passes = {}
    for k in sorted({1, k_max}):
        eligible = [g for g in groups.values() if len(g) >= k]
        passes[str(k)] = round(sum(pass_at_k(len(g), sum(a.correct for a in g), k) for g in eligible)
                               / len(eligible), 4)
    majority_right = [bool(m and m.correct) for m in map(majority, groups.values())]
    return {
        "inputs": len(groups),
        "samples_checked": len(checked),
        "accuracy": round(sum(a.correct for a in checked) / len(checked), 4),
        "pass_at_k": passes,
        "majority_accuracy": round(sum(majority_right) / len(majority_right), 4),
    }

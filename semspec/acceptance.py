"""Where a drafted step is accepted: the rules that keep or reject a step the draft wrote,
from what the target's one pass over it returned. The methods (``semspec.stepwise``) apply
them; probe calibration scores the same rule, vectorised, on held-out steps
(``semspec.calibration.rule_eval.acceptance_probability``)."""

from __future__ import annotations

import torch

from .sampling import uniform
from .types import GenerationConfig


def meaning_decision(probes, pooled_target: torch.Tensor, pooled_draft: torch.Tensor, config: GenerationConfig,
                     coin: torch.Generator) -> tuple[bool, dict]:
    """SemanticSpec's rule: keep a drafted step with probability min(1, p_target / p_draft),
    never when p_target < tau or the ratio is under ``ratio_floor``; and the step log's record."""
    p_t = probes.target.predict(pooled_target)
    p_d = probes.draft.predict(pooled_draft)
    ratio = p_t / max(p_d, 1e-6)
    accept_prob = min(1.0, ratio)
    tau = config.tau or 0.0  # unset (the engine resolves it first): no floor
    if p_t < tau or ratio < config.ratio_floor:
        accept_prob = 0.0
    accepted = accept_prob >= 1.0 or uniform(coin) < accept_prob
    return accepted, {"p_target": p_t, "p_draft": p_d, "accept_prob": accept_prob}


def judge_decision(digit_scores: torch.Tensor, threshold: int) -> tuple[bool, dict]:
    """step_judge's rule from the target's scores of the ten digits (logits or log-probabilities:
    either gives the same softmax over them): keep the step when the best digit is at least
    ``threshold``; the step log's record, its ``p_target`` the expected digit scaled to [0, 1]."""
    score = int(digit_scores.argmax())
    expected = float((torch.softmax(digit_scores, -1) * torch.arange(10, device=digit_scores.device)).sum())
    accepted = score >= threshold
    return accepted, {"judge_score": score, "p_target": expected / 9.0, "accept_prob": 1.0 if accepted else 0.0}

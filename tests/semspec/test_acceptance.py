"""The rules that keep or reject a drafted step."""

from types import SimpleNamespace

import pytest
import torch

from semspec.acceptance import judge_decision, meaning_decision
from semspec.sampling import make_generator
from semspec.types import GenerationConfig


def _probes(p_target: float, p_draft: float):
    """Probes that read these probabilities whatever the states (the rule, not the probes, under test)."""
    return SimpleNamespace(target=SimpleNamespace(predict=lambda states: p_target),
                           draft=SimpleNamespace(predict=lambda states: p_draft))


def _decide(p_target, p_draft, coin=None, **config):
    states = torch.zeros(4)
    return meaning_decision(_probes(p_target, p_draft), states, states, GenerationConfig(**config),
                            coin or make_generator(0))


def test_a_step_the_target_means_at_least_as_surely_as_the_draft_is_always_kept():
    kept, record = _decide(0.8, 0.6)
    assert kept and record == {"p_target": 0.8, "p_draft": 0.6, "accept_prob": 1.0}


def test_below_tau_or_the_ratio_floor_a_step_is_never_kept():
    assert _decide(0.3, 0.2, tau=0.5) == (False, {"p_target": 0.3, "p_draft": 0.2, "accept_prob": 0.0})
    kept, record = _decide(0.5, 1.0, ratio_floor=0.6)  # ratio 0.5
    assert not kept and record["accept_prob"] == 0.0


def test_between_the_floor_and_one_a_step_is_kept_with_the_ratio_as_probability():
    coin = make_generator(7)
    kept = [_decide(0.7, 1.0, coin, ratio_floor=0.0)[0] for _ in range(2000)]
    assert sum(kept) / len(kept) == pytest.approx(0.7, abs=0.03)
    again = make_generator(7)
    assert kept[:50] == [_decide(0.7, 1.0, again, ratio_floor=0.0)[0] for _ in range(50)]  # seeded


def test_the_judge_keeps_a_step_whose_best_digit_reaches_the_threshold():
    scores = torch.full((10,), -10.0)
    scores[7] = 0.0
    kept, record = judge_decision(scores, threshold=7)
    assert kept and record["judge_score"] == 7 and record["accept_prob"] == 1.0
    assert record["p_target"] == pytest.approx(7 / 9, abs=1e-3)
    assert judge_decision(scores, threshold=8)[0] is False

"""`semjobs doom calibrate` on the real embedded target: a rule for it, from its own samples."""

from __future__ import annotations

import pytest

from semspec.doom import DoomRule, stop_at


def test_problems_without_references_or_greedy_sampling_are_refused():
    from semjobs.jobs.doom_calibration import calibrate_rule

    with pytest.raises(ValueError, match="1 problem.*without a reference.*first: b"):
        calibrate_rule([{"id": "a", "prompt": "1+1?", "answer": "2"}, {"id": "b", "prompt": "x"}],
                       4, 0.95, 0.6, 0.95, 16, 0, 4)
    with pytest.raises(ValueError, match="temperature, above 0"):
        calibrate_rule([{"id": "a", "prompt": "1+1?", "answer": "2"}], 4, 0.95, 0.0, 0.95, 16, 0, 4)


@pytest.mark.slow
@pytest.mark.real_model
def test_a_rule_calibrated_on_the_embedded_target_spares_the_right_samples(monkeypatch, tmp_path):
    """Sampled on plain vLLM with every token's log-probabilities: the rule names the target's
    identity, spares the right samples it was chosen to spare, and its file loads back."""
    from semjobs.jobs import yield_vllm
    from semjobs.jobs.doom_calibration import calibrate_rule
    from semjobs.settings import settings
    from tests.conftest import require_vllm

    require_vllm()
    monkeypatch.setattr(settings, "processes", None)
    problems = [{"id": f"p{a}{b}", "prompt": f"What is {a} + {b}? Answer with just the number.", "answer": str(a + b)}
                for a, b in ((1, 1), (2, 2), (1, 3), (2, 1), (3, 3), (1, 2), (4, 1), (2, 3))]
    rule = calibrate_rule(problems, 8, 0.9, 0.6, 0.95, 48, 0, 16)
    assert rule.target == str(yield_vllm.target_source()[1]) and rule.recall == 0.9
    c = rule.calibration
    assert c["samples"] == 64 and c["right"] >= 20 and c["recall"] >= c["recall_needed"] > 0.9
    assert c["n"] == 8 and c["max_new_tokens"] == 48 and c["candidates"]
    assert DoomRule.load(rule.save(tmp_path / "rule.json")) == rule
    assert stop_at(rule, [0.0] * (rule.min_tokens - 1)) is None  # nothing is stopped before min_tokens

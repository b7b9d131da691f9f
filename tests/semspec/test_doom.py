"""semspec.doom: a rule that stops a sample early on its per-token signal, and its calibration."""

from __future__ import annotations

import json
import math
import random

import pytest

from semspec.doom import (
    DoomRule,
    DoomRuleError,
    DoomWatch,
    Trace,
    calibrate,
    allowed_stops,
    calibration_recall,
    stop_at,
    token_signal,
)

TARGET = "smollm2@sha256:" + "a" * 64


def rule(**kw) -> DoomRule:
    return DoomRule(**{"signal": "logprob", "window": 4, "min_tokens": 8, "threshold": -2.0, "recall": 0.95,
                       "target": TARGET, **kw})


def test_a_sample_stops_at_the_first_window_below_the_threshold_from_min_tokens_on():
    confident, doubtful = [-0.1] * 6, [-3.0] * 6
    # tokens 5-8 have mean -1.55, tokens 6-9 -2.275
    assert stop_at(rule(), confident + doubtful) == 9
    # below the threshold from token 4 on: not stopped before min_tokens, stopped at it
    assert stop_at(rule(), doubtful + doubtful + confident) == 8
    assert stop_at(rule(), doubtful[:7]) is None  # ends before min_tokens
    assert stop_at(rule(), confident * 3) is None


def test_an_infinite_threshold_is_a_length_cap():
    assert stop_at(rule(threshold=math.inf), [-0.01] * 20) == 8
    assert stop_at(rule(threshold=math.inf), [-0.01] * 7) is None


def test_a_watch_stays_doomed():
    watch = DoomWatch(rule(threshold=math.inf))
    assert [watch.add(0.0) for _ in range(9)] == [False] * 7 + [True, True]


def test_the_confidence_signal_is_minus_the_mean_of_the_top_five():
    assert token_signal("confidence", -9.0, [-0.5, -1.0, -2.0, -3.0, -3.5, -20.0]) == pytest.approx(2.0)
    assert token_signal("logprob", -9.0, [-0.5]) == -9.0


def test_a_rule_round_trips_through_its_file_an_infinite_threshold_too(tmp_path):
    for r in (rule(), rule(threshold=math.inf, calibration={"samples": 3})):
        path = r.save(tmp_path / "rule.json")
        assert DoomRule.load(path) == r and DoomRule.load(path).calibration == r.calibration
    assert json.loads(path.read_text())["threshold"] is None


def test_the_identity_is_of_the_deciding_fields():
    assert rule().identity == rule(calibration={"samples": 9}).identity
    assert rule().identity != rule(threshold=-1.9).identity
    assert rule().identity.startswith("doom-rule@sha256:")


def test_bad_rules_and_files_are_refused(tmp_path):
    with pytest.raises(DoomRuleError, match="signal"):
        rule(signal="entropy")
    with pytest.raises(DoomRuleError, match="window"):
        rule(window=16, min_tokens=8)
    (tmp_path / "x.json").write_text("[1]")
    with pytest.raises(DoomRuleError, match="not a doom rule"):
        DoomRule.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"signal": "logprob"}')
    with pytest.raises(DoomRuleError, match="not a doom rule"):
        DoomRule.load(tmp_path / "y.json")


def test_a_rule_is_for_the_target_it_was_calibrated_on():
    rule().check_target("/models/other-path@sha256:" + "a" * 64)  # the same weights by another name
    with pytest.raises(DoomRuleError, match="calibrated on smollm2"):
        rule().check_target("other@sha256:" + "b" * 64)


def synthetic(seed: int, problems: int = 60) -> list[Trace]:
    """Right samples short and sure; wrong ones long, their confidence sagging after a while."""
    rng = random.Random(seed)
    traces = []
    for _ in range(problems):
        for _ in range(4):
            right = rng.random() < 0.4
            n = rng.randint(10, 90) if right else rng.randint(40, 300)
            sag = 10**9 if right else rng.randint(20, 120)
            values = [rng.gauss(-0.3 if i < sag else -1.5, 0.3) for i in range(n)]
            traces.append(Trace({"logprob": values, "confidence": [-v for v in values]}, right))
    return traces


def test_calibration_spares_the_right_samples_it_promises_on_unseen_ones():
    """The rule chosen on one set of traces stops at most 1 - recall of the right samples of
    another set drawn alike, and spares most of the wrong ones' tokens."""
    chosen = calibrate(synthetic(0), 0.95, TARGET, settings={"n": 4})
    c = chosen.calibration
    assert c["recall"] >= c["recall_needed"] > 0.95 and c["n"] == 4 and chosen.target == TARGET
    # the best rule of each kind, the chosen one the best of them
    assert set(c["candidates"]) <= {"logprob", "confidence", "length"} and "logprob" in c["candidates"]
    assert c["spared_share"] == max(f["spared_share"] for f in c["candidates"].values())
    assert all(f["recall"] >= c["recall_needed"] for f in c["candidates"].values())
    unseen = synthetic(1)
    right = [t for t in unseen if t.right]
    kept = sum(stop_at(chosen, t.signals[chosen.signal]) is None for t in right)
    assert kept / len(right) >= 0.95
    wrong_tokens = sum(t.tokens for t in unseen if not t.right)
    spared = sum(t.tokens - s for t in unseen if not t.right
                 if (s := stop_at(chosen, t.signals[chosen.signal])) is not None)
    assert spared / wrong_tokens > 0.3


def test_calibration_chooses_among_the_kinds_asked_for_and_records_them_all():
    """A step method applies a length cap only: asked for one, calibration gives the best cap
    even where a signal spares more."""
    traces = synthetic(0)
    any_kind = calibrate(traces, 0.95, TARGET)
    cap = calibrate(traces, 0.95, TARGET, kinds=("length",))
    assert cap.caps_length and cap.calibration["candidates"] == any_kind.calibration["candidates"]
    assert cap.calibration["spared_share"] == any_kind.calibration["candidates"]["length"]["spared_share"]
    assert calibrate(traces, 0.95, TARGET, kinds=("confidence",)).signal == "confidence"
    with pytest.raises(DoomRuleError, match="choose among"):
        calibrate(traces, 0.95, TARGET, kinds=("hidden_state",))
    long_right = [Trace({"logprob": [-0.1] * 600}, True)] * 60 + [Trace({"logprob": [-2.0] * 600}, False)] * 30
    with pytest.raises(DoomRuleError, match="no rule of the kinds length"):
        calibrate(long_right, 0.95, TARGET, kinds=("length",))


def test_the_margin_shrinks_with_more_right_samples():
    assert calibration_recall(0.95, 100) > calibration_recall(0.95, 1000) > 0.95
    # exact: 59 right traces all spared back a promise of 95% (0.95^59 < 0.05), 58 do not
    assert allowed_stops(0.95, 59) == 0 and allowed_stops(0.95, 58) == -1
    assert calibration_recall(0.999, 1) > 1  # no promise


def test_too_few_right_samples_are_refused():
    traces = [Trace({"logprob": [-0.1] * 20}, i < 5) for i in range(50)]
    with pytest.raises(DoomRuleError, match="5 right samples"):
        calibrate(traces, 0.95, TARGET)


def test_a_length_rule_asks_for_no_log_probabilities():
    assert rule(threshold=math.inf).logprobs is None
    assert rule().logprobs == 0 and rule(signal="confidence").logprobs == 5


def test_too_few_right_samples_for_the_promise_are_refused_with_how_many_it_needs():
    """24 right traces, all spared, cannot back 95% on unseen problems: a rule calibrated so
    on GSM8K stopped 2 of 16 right samples there."""
    traces = [Trace({"logprob": [-0.1] * 50}, True)] * 24 + [Trace({"logprob": [-2.0] * 300}, False)] * 100
    with pytest.raises(DoomRuleError, match="24 right samples .* needs at least 59"):
        calibrate(traces, 0.95, TARGET)
    assert calibrate(traces, 0.8, TARGET).calibration["recall"] == 1.0  # a weaker promise they can back

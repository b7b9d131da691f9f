import pytest

from semspec.calibration.overlap import empirical_overlap, meaning_overlap


def test_empirical_overlap():
    assert empirical_overlap([1, 1, 2, 3], [1, 2, 2, 4]) == pytest.approx(0.25 + 0.25)
    assert empirical_overlap([0, 0], [0, 0, 0, 0]) == 1.0
    assert empirical_overlap([0], [1]) == 0.0
    with pytest.raises(ValueError):
        empirical_overlap([], [1])


def test_meaning_overlap_against_the_targets_own_halves():
    src = ["target"] * 4 + ["draft"] * 4
    # the target always says meaning 0; the draft says it half the time
    same = ([0, 0, 0, 0, 0, 0, 1, 2], src)
    # a prefix where the target splits between two meanings and the draft never matches
    split = ([0, 1, 0, 1, 5, 5, 5, 5], src)
    out = meaning_overlap([same, split])
    assert out["prefixes"] == 2 and out["half_sample_size"] == 2
    assert out["target_self"] == pytest.approx((1.0 + 1.0) / 2)
    # same: halves d1=[0,0] -> 1.0 against each target half, d2=[1,2] -> 0.0; split: 0
    assert out["draft_target"] == pytest.approx((0.5 + 0.0) / 2)
    assert out["relative"] == pytest.approx(0.25)
    assert out["draft_target_all_samples"] == pytest.approx((0.5 + 0.0) / 2)
    with pytest.raises(ValueError, match="no prefix"):
        meaning_overlap([([0, 1], ["draft", "draft"])])

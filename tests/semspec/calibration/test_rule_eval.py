import numpy as np
import pytest

from semspec.calibration.rule_eval import acceptance_probability, choose_floor, evaluate_rule


def test_acceptance_probability_is_the_engine_rule():
    acc = acceptance_probability([0.2, 0.5, 0.0, 0.3], [0.4, 0.25, 0.5, 0.0])
    assert acc == pytest.approx([0.5, 1.0, 0.0, 1.0])
    # tau rejects outright when p_T falls below it, whatever the ratio
    floored = acceptance_probability([0.2, 0.05, 0.3], [0.4, 0.01, 0.3], tau=0.1)
    assert floored == pytest.approx([0.5, 0.0, 1.0])
    # the paper's rule: below the ratio floor rejected, above it min(1, ratio)
    paper = acceptance_probability([0.2, 0.35, 0.05], [0.4, 0.5, 0.01], ratio_floor=0.6)
    assert paper == pytest.approx([0.0, 0.7, 1.0])


def test_evaluate_rule_compares_probes_with_label_oracle():
    sources = ["target", "target", "draft", "draft", "draft", "draft"]
    l_t = [0.5, 0.25, 0.5, 0.0, 0.25, 0.0]
    l_d = [0.0, 0.0, 0.5, 0.5, 0.25, 0.25]
    # Probes that accept everything the draft wrote, whatever the target would say.
    p_t = [0.3, 0.3, 0.6, 0.6, 0.6, 0.6]
    p_d = [0.3, 0.3, 0.3, 0.3, 0.3, 0.3]
    out = evaluate_rule(l_t, l_d, p_t, p_d, sources, taus=(0.0, 0.1))
    assert out["n_draft_steps"] == 4
    assert out["draft_target_frequency"] == pytest.approx(0.1875)
    assert out["target_own_frequency"] == pytest.approx(0.375)
    plain = out["by_tau"][0]
    assert plain["probes"]["acceptance"] == 1.0
    assert plain["probes"]["kept_target_frequency"] == pytest.approx(0.1875)
    assert plain["probes"]["kept_unseen_share"] == pytest.approx(0.5)
    # The oracle keeps the two steps the target also says, in full, and nothing else.
    assert plain["oracle"]["acceptance"] == pytest.approx(0.5)
    assert plain["oracle"]["kept_target_frequency"] == pytest.approx(0.375)
    assert plain["oracle"]["kept_unseen_share"] == 0.0
    assert out["by_tau"][1]["tau"] == pytest.approx(0.1)


def test_evaluate_rule_needs_draft_steps():
    with pytest.raises(ValueError, match="draft"):
        evaluate_rule([0.5], [0.0], [0.5], [0.5], ["target"])


def test_nothing_kept_reports_none():
    out = evaluate_rule([0.0, 0.0], [0.5, 0.5], [0.0, 0.0], [0.5, 0.5], ["draft", "draft"], taus=(0.0,))
    assert out["by_tau"][0]["probes"]["kept_target_frequency"] is None
    assert np.isclose(out["by_tau"][0]["probes"]["acceptance"], 0.0)


def test_the_floor_is_a_quantile_of_p_t_on_the_targets_own_steps():
    """The draft's steps take no part: the floor says how target-like the target's own
    writing looks to its probe."""
    p_t = [0.1, 0.2, 0.3, 0.4, 0.5, 0.01, 0.02]
    sources = ["target"] * 5 + ["draft"] * 2
    floor = choose_floor(p_t, sources, 0.25)
    assert floor == {"tau": pytest.approx(0.2), "quantile": 0.25, "n_target_steps": 5}
    assert choose_floor(p_t, sources, 0.0)["tau"] == 0.0  # no floor
    with pytest.raises(ValueError, match="quantile"):
        choose_floor(p_t, sources, 1.0)
    with pytest.raises(ValueError, match="target"):
        choose_floor([0.1], ["draft"], 0.2)

"""The bench's figures from hand-made records (no models)."""

from __future__ import annotations

import pytest

from semspec.benchmark.metrics import (
    agreement,
    goal_check,
    method_figures,
    step_acceptance_by_position,
    summarize,
)
from semspec.benchmark.runner import plan_runs


def rec(method="ar", wall=1.0, gen=10, answer="1", **kw):
    base = dict(method=method, label=method, prompt_id="0", text="", answer=answer, finish_reason="eos",
                wall_seconds=wall, generated_tokens=gen, target_forward_passes=gen, draft_forward_passes=0,
                drafted_tokens=0, accepted_tokens=0, steps_drafted=0, steps_accepted=0, phase_seconds={},
                draft_seconds=0.0, steps=[])
    base.update(kw)
    return base


def test_speedup_is_the_median_of_per_prompt_ratios():
    ar = [rec(wall=2.0), rec(wall=4.0), rec(wall=9.0)]
    sd = [rec("token_sd", wall=1.0), rec("token_sd", wall=4.0), rec("token_sd", wall=3.0)]
    f = method_figures(sd, ar, [{}] * 3)
    assert f["speedup_vs_ar"] == pytest.approx(2.0)
    assert f["speedup_vs_ar_mean"] == pytest.approx((2 + 1 + 3) / 3)
    assert f["tokens_per_second"] == pytest.approx(30 / 8)


def test_per_token_speedup_leaves_the_answers_length_out():
    ar = [rec(wall=2.0, gen=100), rec(wall=3.0, gen=100), rec(wall=1.0, gen=50)]
    # the method writes twice as long an answer to prompt 0 in the same time per token
    m = [rec("semspec", wall=4.0, gen=200), rec("semspec", wall=1.5, gen=100), rec("semspec", wall=0.5, gen=50)]
    f = method_figures(m, ar, [{}] * 3)
    assert f["speedup_vs_ar"] == pytest.approx(2.0)  # per-prompt wall-clock: 0.5, 2, 2
    assert f["speedup_vs_ar_per_token"] == pytest.approx(2.0)  # per token: 1, 2, 2
    f = method_figures(m[:1], ar[:1], [{}])
    assert f["speedup_vs_ar"] == pytest.approx(0.5) and f["speedup_vs_ar_per_token"] == pytest.approx(1.0)


def test_agreement_accuracy_and_missing_runs():
    ar = [rec(answer="1"), rec(answer=None), rec(answer="3"), rec(answer="4")]
    m = [rec("semspec", answer="1"), rec("semspec", answer=None), rec("semspec", answer="9"), None]
    assert agreement(m, ar) == pytest.approx(2 / 3)  # "no answer" agrees with "no answer"; None run skipped
    f = method_figures(m, ar, [{"reference": "1"}, {"reference": "2"}, {"reference": None}, {"reference": "4"}])
    assert f["accuracy"] == pytest.approx(1 / 2)
    assert f["answers_found"] == pytest.approx(2 / 3)
    assert f["prompts_run"] == 3


def test_token_and_step_figures():
    ar = [rec(gen=20)]
    sd = [rec("token_sd", gen=20, target_forward_passes=6, drafted_tokens=20, accepted_tokens=15,
              draft_seconds=0.25, phase_seconds={"draft": 0.25, "verify": 0.5})]
    f = method_figures(sd, ar, [{}])
    assert f["token_acceptance_rate"] == pytest.approx(0.75)
    assert f["mean_accepted_length"] == pytest.approx(15 / 5)  # 5 verification passes after the prefill
    assert f["mean_accepted_length_incl_bonus"] == pytest.approx(4.0)
    assert f["draft_time_share"] == pytest.approx(0.25)
    assert f["phase_share"]["other"] == pytest.approx(0.25)
    steps = [[0, "draft", "accepted", 5, 5, 5, 0.9, 0.8], [1, "target", "rejected", 4, 0, 6, 0.1, 0.9],
             [2, "target", "target_only", 0, 0, 3, None, None]]
    ss = [rec("semspec", gen=14, steps_drafted=2, steps_accepted=1, drafted_tokens=9, accepted_tokens=5, steps=steps)]
    g = method_figures(ss, ar, [{}])
    assert g["step_acceptance_rate"] == 0.5
    assert g["mean_accepted_length"] == pytest.approx(2.5)
    assert g["mean_accepted_length_incl_bonus"] is None
    assert g["output_length_vs_ar"] == pytest.approx(14 / 20)
    assert [r["position"] for r in g["step_acceptance_by_position"]] == [0, 1]


def test_step_acceptance_by_position_pools_late_steps():
    steps = [[i, "draft", "accepted" if i % 2 == 0 else "rejected", 3, 3, 3, None, None] for i in range(6)]
    rows = step_acceptance_by_position([rec("semspec", steps=steps), None], max_position=3)
    assert [(r["position"], r["drafted"], r["accepted"]) for r in rows] == [(0, 1, 1), (1, 1, 0), (2, 1, 1), (3, 3, 1)]


def test_summarize_self_agreement_and_goal():
    prompts = [{"reference": "1"}, {"reference": "2"}]
    runs = {
        "ar": [rec(answer="1", wall=4.0), rec(answer="2", wall=4.0)],
        "ar_2": [rec(answer="1", wall=4.0), rec(answer="5", wall=4.0)],
        "semspec": [rec("semspec", answer="1", wall=1.0), rec("semspec", answer="7", wall=2.0)],
        "token_sd": [rec("token_sd", answer="1", wall=2.0), rec("token_sd", answer="2", wall=2.0)],
    }
    s = summarize(prompts, runs, {"semspec": {"method": "semspec", "tau": 0.0}}, temperature=0.6)
    assert s["ar_self_agreement"] == 0.5
    assert s["methods"]["semspec"]["speedup_vs_ar"] == pytest.approx(3.0)
    assert s["methods"]["semspec"]["tau"] == 0.0
    g = s["goal"]
    assert g["speedup_met"] and g["agreement_met"]  # 0.5 >= 0.5 - 0.05
    assert g["peers"]["token_sd"]["semspec_ahead"] is False  # faster, but agrees less than token_sd
    assert summarize(prompts, {"ar": runs["ar"]}, {}, temperature=0.0)["ar_self_agreement"] == 1.0
    assert goal_check({}, 1.0)["evaluated"] is False


def test_plan_runs():
    labels = [r.label for r in plan_runs(["token_sd", "semspec"], (None, 0.0, 0.3), temperature=0.6)]
    assert labels == ["ar", "ar_2", "token_sd", "semspec", "semspec@tau=0", "semspec@tau=0.3"]  # None: the probes' floor
    greedy = plan_runs(["ar", "semspec"], None, temperature=0.0)
    assert [r.label for r in greedy] == ["ar", "semspec"] and greedy[1].default_setting
    with pytest.raises(ValueError, match="unknown method"):
        plan_runs(["beam"], None, 0.0)
    paper = plan_runs(["semspec"], None, temperature=0.6, ratio_floors=(0.0, 0.6))
    assert [r.label for r in paper] == ["ar", "ar_2", "semspec@ratio_floor=0", "semspec"]
    assert paper[2].meta()["ratio_floor"] == 0.0 and not paper[2].default_setting
    crossed = plan_runs(["semspec"], (None, 0.1), temperature=0.6, attempts=(1, 3))
    assert [r.label for r in crossed] == ["ar", "ar_2", "semspec", "semspec@attempts=3", "semspec@tau=0.1",
                                          "semspec@tau=0.1,attempts=3"]
    assert [r.default_setting for r in crossed[2:]] == [True, False, False, False]
    assert crossed[3].meta() == {"method": "semspec", "default_setting": False, "tau": None, "ratio_floor": 0.6,
                                 "draft_attempts": 3, "draft_candidates": 1, "adaptive": True,
                                 "token_speculation": True}
    candidates = plan_runs(["semspec"], None, temperature=0.6, candidates=(1, 3))
    assert [r.label for r in candidates] == ["ar", "ar_2", "semspec", "semspec@candidates=3"]
    assert candidates[3].meta()["draft_candidates"] == 3
    stacked = plan_runs(["semspec"], None, temperature=0.0, token_speculation=(True, False))
    assert [r.label for r in stacked] == ["ar", "semspec", "semspec@token_sd=0"]
    assert stacked[2].meta()["token_speculation"] is False
    switched = plan_runs(["semspec"], None, temperature=0.6, adaptive=(True, False))
    assert [r.label for r in switched] == ["ar", "ar_2", "semspec", "semspec@adaptive=0"]
    assert switched[3].meta()["adaptive"] is False
    with pytest.raises(ValueError, match="at least 1"):
        plan_runs(["semspec"], None, 0.6, attempts=(0,))


def test_cost_model_ceiling():
    from semspec.benchmark.metrics import cost_model

    ar = [rec(wall=10.0, gen=100)]  # 0.1 s per token
    sem = [rec("semspec", wall=5.0, gen=100, draft_forward_passes=80, drafted_tokens=80, accepted_tokens=60,
               steps_drafted=4, steps_accepted=3, draft_seconds=2.0, phase_seconds={"draft": 2.0, "verify": 1.2})]
    methods = {"ar": method_figures(ar, ar, [{}]), "semspec": method_figures(sem, ar, [{}])}
    cm = cost_model(methods)
    assert cm["semspec.draft_cost_ratio"] == pytest.approx(0.025 / 0.1)
    assert cm["semspec.seconds_per_drafted_token_draft_plus_verify"] == pytest.approx(3.2 / 80)
    assert cm["semspec.speedup_ceiling_at_full_acceptance"] == pytest.approx(0.1 / 0.04)
    assert cm["semspec.share_of_output_tokens_drafted"] == pytest.approx(0.6)
    assert cm["semspec.wasted_draft_time_share"] == pytest.approx(2.0 * 0.25 / 5.0)

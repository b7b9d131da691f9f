"""Adaptive speculation (semspec.adaptive): a sequence drafts steps only while its measured
acceptance pays for the drafting; otherwise the target writes, backing off, and looks again."""

from __future__ import annotations

import pytest

from semspec.adaptive import FIRST_BACKOFF, MAX_BACKOFF, Governor
from semspec.engine import Engine
from semspec.probes import ProbePair
from semspec.types import GenerationConfig
from tests.semspec.test_engine import PROMPT, cfg


def test_break_even_is_the_acceptance_at_which_a_drafted_step_pays():
    g = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20)
    # 20 draft passes (3.2) + a verification (1 + 1.32) against 20 target passes kept at a
    assert g.break_even() == pytest.approx((20 * 0.16 + 1 + 0.066 * 20) / 20)
    assert Governor(0.0, 0.0, step_tokens=1).break_even() == 1.0  # a 1-token step never pays


def test_failures_back_off_doubling_and_a_kept_step_resumes():
    g = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20)
    waits = []
    for _ in range(8):
        assert g.should_speculate()
        g.observe_verification(False)
        n = 0
        while not g.should_speculate():
            n += 1
        waits.append(n)
        g.waiting = 0
    # the prior (0.5, as one step) and one rejection: 0.25, under break-even (0.28); then
    # 2, 4, 8, ... steps, at most 32
    assert waits == [FIRST_BACKOFF, 4, 8, 16, MAX_BACKOFF, MAX_BACKOFF, MAX_BACKOFF, MAX_BACKOFF]
    g.observe_verification(True)  # later steps weigh SMOOTHING: one kept step climbs back over
    assert g.acceptance > g.break_even() and g.should_speculate() and g.backoff == FIRST_BACKOFF


def test_back_off_steps_written_in_one_go_are_skipped_together():
    g = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20)
    g.observe_verification(False)
    assert not g.should_speculate()  # the first of FIRST_BACKOFF steps
    g.skip(5)  # a run of target tokens that closed more steps than were left
    assert g.waiting == 0 and g.should_speculate()


def test_the_first_steps_move_the_estimate_as_a_mean_would():
    g = Governor(draft_cost=0.16, verify_cost_per_token=0.066)
    g.observe_verification(True)
    assert g.acceptance == pytest.approx(0.75)  # (0.5 + 1) / 2
    g.observe_verification(False)
    assert g.acceptance == pytest.approx(0.5)  # (0.5 + 1 + 0) / 3
    g.observe_verification(False)
    assert g.acceptance == pytest.approx(0.5 * 0.7)  # from here an exponential average


@pytest.fixture(scope="module")
def reject_engine(tiny_target, tiny_draft):
    return Engine(tiny_target, tiny_draft, ProbePair.always_reject(64, 64))


def test_a_useless_draft_is_tried_less_and_less_and_the_text_stays_the_targets(reject_engine, tiny_target):
    long = dict(max_new_tokens=120)
    ar = Engine(tiny_target).generate(PROMPT, cfg("ar", **long))
    fixed = reject_engine.generate(PROMPT, cfg("semspec", adaptive=False, **long))
    adaptive = reject_engine.generate(PROMPT, cfg("semspec", **long))
    assert adaptive.text == fixed.text == ar.text  # greedy, nothing kept: the target's own text
    backoffs = [s for s in adaptive.steps if s.reason == "backoff"]
    assert backoffs and all(s.decision == "target_only" and s.author == "target" for s in backoffs)
    assert not [s for s in fixed.steps if s.reason == "backoff"]
    # every step drafted without it; a few probes with it
    assert fixed.counters.steps_drafted >= 2 * adaptive.counters.steps_drafted
    assert adaptive.counters.draft_forward_passes < fixed.counters.draft_forward_passes / 2


def test_a_draft_that_is_always_kept_never_backs_off(tiny_target, tiny_draft):
    r = Engine(tiny_target, tiny_draft, ProbePair.always_accept(64, 64)).generate(PROMPT, cfg("semspec"))
    assert r.steps and all(s.decision == "accepted" for s in r.steps)


def test_decisions_are_reproducible_and_costs_are_checked(tiny_target, tiny_draft):
    half = Engine(tiny_target, tiny_draft, ProbePair.constant(0.3, 1.0, 64, 64))  # a p = 0.3 coin
    runs = [half.generate(PROMPT, cfg("semspec", temperature=0.9, seed=5, max_new_tokens=100, ratio_floor=0))
            for _ in range(2)]
    assert runs[0].text == runs[1].text
    assert [(s.decision, s.reason) for s in runs[0].steps] == [(s.decision, s.reason) for s in runs[1].steps]
    with pytest.raises(ValueError, match="draft_cost"):
        half.generate(PROMPT, cfg("semspec", draft_cost=-1))


def test_the_draft_cost_is_the_drafts_own_unless_the_job_sets_it(tiny_target, tiny_draft):
    import dataclasses

    from semspec.components import EMBEDDED_HEAD, MEASURED_DRAFT_COST
    from semspec.models import DEFAULT_TARGET
    from tests.semspec.test_head import _head_model

    engine = Engine(tiny_target, tiny_draft, ProbePair.always_accept(64, 64))
    estimate = tiny_draft.weights_per_pass / tiny_target.weights_per_pass  # 1 layer of the target's 2
    assert 0.3 < estimate < 0.9
    assert engine.resolve(GenerationConfig(method="semspec")).draft_cost == pytest.approx(estimate)
    assert engine.resolve(cfg("semspec", draft_cost=0.5)).draft_cost == 0.5
    # a head shares the target's embedding and LM head: its pass reads its own modules and the head
    head = _head_model(tiny_target)
    own = sum(p.numel() for p in head.model.parameters())
    lm_head = tiny_target.model.get_output_embeddings().weight.numel()
    assert Engine(tiny_target, head).draft_cost == pytest.approx((own + lm_head) / tiny_target.weights_per_pass)
    # the embedded pairs use the costs measured for them
    named = Engine(dataclasses.replace(tiny_target, spec=DEFAULT_TARGET), dataclasses.replace(head, spec=EMBEDDED_HEAD))
    assert named.draft_cost == MEASURED_DRAFT_COST[EMBEDDED_HEAD]
    assert Engine(tiny_target).resolve(GenerationConfig(method="ar")).draft_cost is None

"""Adaptive speculation (semspec.adaptive): a sequence drafts steps only while its measured
acceptance pays for the drafting; otherwise the target writes, backing off, and looks again."""

from __future__ import annotations

import pytest

from semspec.adaptive import FIRST_BACKOFF, MAX_BACKOFF, Governor


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


def test_measured_costs_decide_once_each_is_known():
    """A job that leaves its costs to the engine decides on what the engine measured, in units
    of its own writing: a writer twice as fast doubles what a drafted token costs."""
    from semspec.adaptive import LiveCosts, Meter

    write, draft, verify = Meter(), Meter(), Meter()
    g = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20, live=LiveCosts(write, draft, verify))
    fixed = (20 * 0.16 + 1 + 0.066 * 20) / 20
    assert g.break_even() == pytest.approx(fixed)  # nothing measured yet: the config's
    draft.observe(0.2, 20)   # a 20-token step drafted in 0.2 s, and a read of its states (seconds, no token)
    draft.observe(0.04, 0)   # so 0.012 s a drafted token
    verify.observe(0.05)
    assert g.break_even() == pytest.approx(fixed)  # the writing not yet
    write.observe(0.6, 20)   # 0.03 s a written token
    assert g.break_even() == pytest.approx((20 * 0.012 / 0.03 + 0.05 / 0.03) / 20)
    write.observe(0.3, 20)   # faster writing (0.0225 s a token over both calls) raises the bar
    assert g.break_even() == pytest.approx((20 * 0.012 / 0.0225 + 0.05 / 0.0225) / 20)


def test_a_jobs_sequences_start_from_what_its_earlier_ones_found():
    """Live costs carry the job's experience: a new sequence's prior is the rate at which the
    job's drafts were kept, its back-off as long as the job's have grown; a verification that
    finds drafting paying shortens them again for every sequence."""
    from semspec.adaptive import JobExperience, LiveCosts, Meter

    shared = JobExperience()
    live = LiveCosts(Meter(), Meter(), Meter(), shared)
    first = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20, live=live)
    assert first.acceptance == 0.5  # nothing learned yet: the prior
    for wait in (FIRST_BACKOFF, 4, 8):
        first.observe_verification(False)
        assert first.waiting == wait
        first.waiting = 0
    assert shared.acceptance == 0.0 and shared.verified == 3 and shared.backoff == 16
    second = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20, live=live)
    assert second.acceptance == 0.0 and second.should_speculate()  # its first step is drafted
    second.observe_verification(False)
    assert second.waiting == 16 and shared.backoff == MAX_BACKOFF  # then it writes on, as the job learned
    alone = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20)  # a job that fixed its costs
    alone.observe_verification(False)
    assert alone.waiting == FIRST_BACKOFF
    third = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20, live=live)
    for _ in range(4):
        third.observe_verification(True)
    assert third.acceptance > third.break_even() and shared.backoff == FIRST_BACKOFF
    assert shared.acceptance == pytest.approx(4 / 8)  # a mean over the first verifications (20 of them)

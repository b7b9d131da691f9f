"""Adaptive speculation (semspec.adaptive): a sequence drafts steps only while its measured
acceptance pays for the drafting; otherwise the target writes, backing off, and looks again."""

from __future__ import annotations

import pytest

from semspec.adaptive import FIRST_BACKOFF, MAX_BACKOFF, TRUSTED_VERIFICATIONS, Governor, JobExperience, LiveCosts, Meter


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


def test_a_meter_splits_a_calls_fixed_cost_from_its_cost_per_unit():
    """Seconds = 0.25 + 0.05 per token, over requests of varied lengths: the line is found;
    calls of one size, or too few, tell no fixed part; noise under zero counts as none."""
    m = Meter()
    for tokens in (20, 120, 35, 256, 20, 64):
        m.observe(0.25 + 0.05 * tokens, tokens)
    fixed, per_token = m.split()
    assert fixed == pytest.approx(0.25) and per_token == pytest.approx(0.05)
    same = Meter()
    for _ in range(10):
        same.observe(1.25, 20)
    assert same.split() is None and same.per_unit() == pytest.approx(1.25 / 20)
    few = Meter()
    for tokens in (20, 120, 35):
        few.observe(0.25 + 0.05 * tokens, tokens)
    assert few.split() is None
    cheaper_when_short = Meter()  # a fixed part under zero: none (the average per token stands)
    for tokens, seconds in ((20, 0.5), (200, 8.0), (20, 0.5), (200, 8.0)):
        cheaper_when_short.observe(seconds, tokens)
    assert cheaper_when_short.split() is None


def test_the_writings_re_entry_raises_the_break_even():
    """A rejected step costs the writer a request it would not have made: with the writing
    split into 0.25 s a request and 0.05 s a token, a 20-token step drafted at 0.012 s a token
    and verified in 0.3 s pays above (20 * 0.24 + 6 + 5) / (20 + 5), not (20 * 0.012 + 0.3) /
    (20 * average per token)."""
    write, draft, verify = Meter(), Meter(), Meter()
    g = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20, live=LiveCosts(write, draft, verify))
    draft.observe(0.24, 20)
    verify.observe(0.3)
    for tokens in (20, 120, 35, 256):
        write.observe(0.25 + 0.05 * tokens, tokens)
    assert g.break_even() == pytest.approx((20 * 0.012 / 0.05 + 0.3 / 0.05 + 0.25 / 0.05) / (20 + 0.25 / 0.05))
    average = write.per_unit()
    assert g.break_even() > (20 * 0.012 + 0.3) / (20 * average)
    whole = Meter()  # calls whose line finds no fixed part: no re-entry, the average per token
    for tokens, seconds in ((20, 0.5), (200, 8.0), (20, 0.5), (200, 8.0)):
        whole.observe(seconds, tokens)
    g = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20, live=LiveCosts(whole, draft, verify))
    assert g.break_even() == pytest.approx((20 * 0.012 + 0.3) / (20 * whole.per_unit()))


def test_once_a_job_knows_its_drafts_lose_new_sequences_start_backed_off():
    """After TRUSTED_VERIFICATIONS of the job's steps, kept under the break-even, a new
    sequence writes the job's back-off first (then drafts a step to look), but for one in a
    back-off's steps of the job's, which drafts its first step; before that, or where the
    job's drafts pay, each drafts its first step."""
    shared = JobExperience()
    live = LiveCosts(Meter(), Meter(), Meter(), shared)
    first = Governor(draft_cost=0.16, verify_cost_per_token=0.066, step_tokens=20, live=live)
    for _ in range(TRUSTED_VERIFICATIONS - 1):
        first.observe_verification(False)
        first.waiting = 0
    assert Governor(0.16, 0.066, step_tokens=20, live=live).should_speculate()  # not yet trusted
    first.observe_verification(False)
    backed_off = Governor(0.16, 0.066, step_tokens=20, live=live)
    assert backed_off.waiting == shared.backoff == MAX_BACKOFF and not backed_off.should_speculate()
    for _ in range(MAX_BACKOFF - 1):  # the job's sequences close steps: one short of a back-off
        backed_off.observe_step(20)
    assert Governor(0.16, 0.066, step_tokens=20, live=live).waiting == MAX_BACKOFF
    backed_off.observe_step(20)
    looks = Governor(0.16, 0.066, step_tokens=20, live=live)  # a back-off's steps since a look: it looks
    assert looks.should_speculate() and shared.steps_since_look == 0
    assert Governor(0.16, 0.066, step_tokens=20, live=live).waiting == MAX_BACKOFF  # and the next does not
    for _ in range(2 * TRUSTED_VERIFICATIONS):  # the job's drafts then pay: new sequences draft again
        first.observe_verification(True)
    assert Governor(0.16, 0.066, step_tokens=20, live=live).should_speculate()

"""When a sequence should speculate: only while a drafted step is expected to cost less per
token than the target writing the step itself.

Per drafted step, in units of one target decoding pass (a token the target writes):

    speculating costs   L * draft_cost  +  (1 + verify_cost_per_token * L)  +  (1 - a) * L
                        (drafting)         (one verification pass)            (rewrite on reject)
    the target alone    L

for a step of L tokens kept with probability a. Speculating pays while
a > (L * draft_cost + 1 + verify_cost_per_token * L) / L: with the embedded pair's measured
costs (0.16 and 0.066, docs/benchmarks.md) and 20-token steps, about 0.28.

Each sequence keeps a running estimate of a over its own verified steps and of L over all
its steps. The estimate of a starts at one half, weighted as one step: the first verified
steps move it as a mean would (one rejection brings it to 0.25, under the break-even; one
kept step to 0.75), later ones as an exponential average that follows a sequence whose
steps get harder or easier. Answers here are 5 to 20 steps long, so how soon a useless draft
is noticed is most of what it costs (docs/benchmarks.md, "Adaptive speculation"). Below the
break-even the target writes the next steps itself, 2 at first, doubling up to 32 while
speculation keeps failing; then one step is drafted again to look (back-off). The costs are
fixed per job (settings of the GenerationConfig, recorded with it), not read off the clock,
so a rerun with the same seed makes the same decisions and the same text.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIOR_ACCEPTANCE = 0.5  # a fresh sequence drafts: nothing is known of its steps yet
PRIOR_WEIGHT = 1.0  # the prior counts as this many verified steps
PRIOR_STEP_TOKENS = 20.0
SMOOTHING = 0.3  # weight of the newest step in the step-length estimate, and at least in a's
FIRST_BACKOFF, MAX_BACKOFF = 2, 32


@dataclass
class Governor:
    draft_cost: float  # one draft pass, in target decoding passes
    verify_cost_per_token: float  # a verification pass's cost over a decoding pass, per token
    acceptance: float = PRIOR_ACCEPTANCE
    step_tokens: float = PRIOR_STEP_TOKENS
    verified: int = 0  # drafted steps verified so far
    backoff: int = FIRST_BACKOFF  # steps the target writes on the next back-off
    waiting: int = 0  # target-written steps left in the current back-off

    def break_even(self) -> float:
        """The acceptance rate above which drafting a step pays for itself."""
        n = max(self.step_tokens, 1.0)
        return min(1.0, (n * self.draft_cost + 1.0 + self.verify_cost_per_token * n) / n)

    def should_speculate(self) -> bool:
        """Whether to draft the next step; False: the target writes it (a back-off step)."""
        if self.waiting > 0:
            self.waiting -= 1
            return False
        return True

    def skip(self, steps: int) -> None:
        """``steps`` more back-off steps were written (several in one go): fewer are left."""
        self.waiting = max(0, self.waiting - steps)

    def observe_step(self, target_tokens: int) -> None:
        """Any closed step: its length in target tokens."""
        if target_tokens > 0:
            self.step_tokens += SMOOTHING * (target_tokens - self.step_tokens)

    def observe_verification(self, accepted: bool) -> None:
        """A drafted step was verified: update the estimate, back off when below break-even."""
        self.verified += 1
        weight = max(SMOOTHING, 1.0 / (self.verified + PRIOR_WEIGHT))
        self.acceptance += weight * (float(accepted) - self.acceptance)
        if self.acceptance >= self.break_even():
            self.backoff = FIRST_BACKOFF
            return
        self.waiting = self.backoff
        self.backoff = min(2 * self.backoff, MAX_BACKOFF)

"""When a sequence should speculate: only while a drafted step is expected to cost less per
token than the target writing the step itself.

Per drafted step, in units of one target decoding pass (a token the target writes):

    speculating costs   L * draft_cost  +  (1 + verify_cost_per_token * L)  +  (1 - a) * L
                        (drafting)         (one verification pass)            (rewrite on reject)
    the target alone    L

for a step of L tokens kept with probability a. Speculating pays while
a > (L * draft_cost + 1 + verify_cost_per_token * L) / L: with the embedded pair's measured
costs (0.16 and 0.066, measured at batch 1) and 20-token steps, about 0.28.

Each sequence keeps a running estimate of a over its own verified steps and of L over all
its steps. The estimate of a starts at one half, weighted as one step: the first verified
steps move it as a mean would (one rejection brings it to 0.25, under the break-even; one
kept step to 0.75), later ones as an exponential average that follows a sequence whose
steps get harder or easier. Answers here are 5 to 20 steps long, so how soon a useless draft
is noticed is most of what it costs. Below the
break-even the target writes the next steps itself, 2 at first, doubling up to 32 while
speculation keeps failing; then one step is drafted again to look (back-off). The costs are
fixed per job (settings of the GenerationConfig, recorded with it), not read off the clock,
so a rerun with the same seed makes the same decisions and the same text.

Unless the job leaves its costs to the engine (``GenerationConfig.draft_cost`` None): then
they are what the running engine measures (:class:`LiveCosts`), per-request overheads
included, and in units of the target's own writing as it is done (with token-level
speculation a written token is cheaper, and drafting must beat that): drafting pays while

    a > (L * draft_seconds_per_token + seconds_per_verification) / (L * write_seconds_per_token)

Decisions then follow the machine's speed as well as the seed. The writing's cost is split
(``Meter.split``) into what a request costs whatever its length (the prefill of what it has
not cached, speculation's restart: the re-entry) and a cost per token: a rejected step sends
the sequence back to the writer in a request it would not have made, which a kept one does
not, so, per drafted step of L tokens, in the writing's tokens (r the re-entry),

    a * (L + r) > L * draft_seconds_per_token + seconds_per_verification + r

(2-core AVX2 host, T 0.6: a written token 0.047 s, a re-entry 0.26 s, a drafted step of 20
tokens 0.58 s with its verification: break-even 0.70 where the average per token, 0.050 s,
said 0.58; a one-off measurement, its script in git history as benchmarks/writer_calls.py.
Where the writer's calls are nearly all whole answers their
line finds no fixed part, and the rule is the one above.)

A job that leaves its costs to the engine also learns from its earlier sequences
(:class:`JobExperience`, one per engine and kind of job): a new sequence's estimate of a starts
from the rate at which the job's drafted steps were kept, and a sequence backs off for as long
as the job's back-offs have grown (each rejection that backs off, in any of its sequences,
doubles them), since the last verification that found drafting paying. Once the job has
verified ``TRUSTED_VERIFICATIONS`` steps, a new sequence whose prior is under the break-even
starts with that back-off (it writes its first steps itself, then drafts one to look), unless
the job's sequences have closed a back-off's worth of steps since one last drafted its first
step: then it does, so that a long job keeps looking, about once in 32 steps, whatever the
length of its answers. So where the draft rarely says what the target would (sampling), a
new sequence writes on alone, instead of learning it again over 2, 4, 8, ... steps of every
answer or drafting a first step the job already knows loses. Its decisions then also depend
on the sequences the engine ran before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_ACCEPTANCE = 0.5  # a fresh sequence drafts: nothing is known of its steps yet
PRIOR_WEIGHT = 1.0  # the prior counts as this many verified steps
PRIOR_STEP_TOKENS = 20.0
SMOOTHING = 0.3  # weight of the newest step in the step-length estimate, and at least in a's
FIRST_BACKOFF, MAX_BACKOFF = 2, 32
TRUSTED_VERIFICATIONS = 4  # a job's verified steps before its new sequences start as it found


# weight of the newest call in a meter's moving averages
METER_SMOOTHING = 0.05


# calls a meter's split waits for, and how much their sizes must vary (their standard
# deviation over their mean) before a line through them means something
SPLIT_CALLS, SPLIT_SPREAD = 4, 0.25


@dataclass
class Meter:
    """Seconds per unit of one kind of call, as moving averages of seconds and of units (so
    a call of many tokens weighs more than a call of one); or any other quantity per unit
    (``JobExperience``: kept steps per verification). The averages of units squared and of
    seconds times units, under the same weights, give ``split``."""

    seconds: float = 0.0
    units: float = 0.0
    calls: int = 0
    squares: float = 0.0
    products: float = 0.0

    def observe(self, seconds: float, units: float = 1.0) -> None:
        w = max(METER_SMOOTHING, 1.0 / (self.calls + 1))
        self.seconds += w * (seconds - self.seconds)
        self.units += w * (units - self.units)
        self.squares += w * (units * units - self.squares)
        self.products += w * (seconds * units - self.products)
        self.calls += 1

    def per_unit(self) -> float | None:
        return self.seconds / self.units if self.calls and self.units > 0 else None

    def split(self) -> tuple[float, float] | None:
        """(seconds a call costs whatever its size, seconds per unit): the weighted least-squares
        line through the calls; None until there are ``SPLIT_CALLS`` of sizes that vary, or
        where the line falls with size or finds no fixed part (noise, or calls that cost only
        by their size): the average per unit (``per_unit``) then stands for both."""
        variance = self.squares - self.units ** 2
        if self.calls < SPLIT_CALLS or variance <= (SPLIT_SPREAD * self.units) ** 2:
            return None
        slope = (self.products - self.seconds * self.units) / variance
        if slope <= 0:
            return None
        fixed = self.seconds - slope * self.units
        return (fixed, slope) if fixed > 0 else None


@dataclass
class JobExperience:
    """What a job's sequences on one engine found of drafting, for the next ones: how often
    their drafted steps were kept (a Meter of kept steps per verification), how many steps
    the next back-off writes, and how many steps its sequences closed since one of them last
    drafted its first step (``Governor.__post_init__``)."""

    kept: Meter = field(default_factory=Meter)
    backoff: int = FIRST_BACKOFF
    steps_since_look: int = 0

    @property
    def acceptance(self) -> float | None:
        return self.kept.per_unit()

    @property
    def verified(self) -> int:
        return self.kept.calls

    def observe(self, accepted: bool) -> None:
        self.kept.observe(float(accepted))


@dataclass(frozen=True)
class LiveCosts:
    """What a sequence's drafting costs on the running engine: seconds per token the target's
    own writing takes (as it is routed: speculating or not), per drafted token (the step's
    draft calls and the read of its states), per verification."""

    write: Meter
    draft: Meter
    verify: Meter
    experience: JobExperience = field(default_factory=JobExperience)  # the job's, shared by its sequences

    def ratios(self) -> tuple[float, float, float] | None:
        """(a drafted token, a verification, a re-entry of the writing) in written tokens, once
        each was measured; the writing by its cost per token beyond its requests' fixed part
        (none until ``Meter.split`` finds one: then its average per token)."""
        w, d, v = self.write.per_unit(), self.draft.per_unit(), self.verify.per_unit()
        if not (w and d is not None and v is not None):
            return None
        reentry, per_token = self.write.split() or (0.0, w)
        return d / per_token, v / per_token, reentry / per_token


@dataclass
class Governor:
    draft_cost: float  # one draft pass, in target decoding passes
    verify_cost_per_token: float  # a verification pass's cost over a decoding pass, per token
    live: LiveCosts | None = field(default=None, repr=False)  # the engine's measured costs, over the above
    acceptance: float = PRIOR_ACCEPTANCE
    step_tokens: float = PRIOR_STEP_TOKENS
    verified: int = 0  # drafted steps verified so far
    backoff: int = FIRST_BACKOFF  # steps the target writes on the next back-off
    waiting: int = 0  # target-written steps left in the current back-off

    def __post_init__(self) -> None:
        shared = self.shared
        if shared is not None and shared.acceptance is not None:
            self.acceptance = shared.acceptance  # the prior: what the job's drafts have done so far
            losing = shared.verified >= TRUSTED_VERIFICATIONS and self.acceptance < self.break_even()
            if losing and shared.steps_since_look < shared.backoff:
                self.waiting = shared.backoff  # it starts backed off
            else:  # it drafts its first step: the job's look, at most a back-off's steps apart
                shared.steps_since_look = 0

    @property
    def shared(self) -> JobExperience | None:
        return self.live.experience if self.live is not None else None

    def break_even(self) -> float:
        """The acceptance rate above which drafting a step pays for itself."""
        n = max(self.step_tokens, 1.0)
        measured = self.live.ratios() if self.live is not None else None
        if measured is not None:
            draft, verification, reentry = measured
            return min(1.0, (n * draft + verification + reentry) / (n + reentry))
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
        if self.shared is not None:
            self.shared.steps_since_look += 1

    def observe_verification(self, accepted: bool) -> None:
        """A drafted step was verified: update the estimate, back off when below break-even."""
        self.verified += 1
        weight = max(SMOOTHING, 1.0 / (self.verified + PRIOR_WEIGHT))
        self.acceptance += weight * (float(accepted) - self.acceptance)
        shared = self.shared
        if shared is not None:
            shared.observe(accepted)
            self.backoff = shared.backoff
        if self.acceptance >= self.break_even():
            self.backoff = FIRST_BACKOFF
        else:
            self.waiting = self.backoff
            self.backoff = min(2 * self.backoff, MAX_BACKOFF)
        if shared is not None:
            shared.backoff = self.backoff

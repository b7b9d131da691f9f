"""Plain data passed between the engine and its callers.

The engine fills these; callers (the worker, the bench, the CLI) only read them. Counters
are raw counts: ratios are derived where they are reported, so their meaning stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

METHODS = ("ar", "token_sd", "step_judge", "semspec")
# The draft spec that names no model: vLLM's prompt-lookup drafting (token_sd on vLLM,
# semspec.engine.speculation).
NGRAM_DRAFT = "ngram"
# The methods vLLM runs at step level, on a target and a draft engine (semspec.engine.step_engine).
VLLM_STEP_METHODS = ("semspec", "step_judge")
ANSWER_BY = ("target", "draft")
# Step rule when neither the caller nor the loaded probes say otherwise: reasoning models
# separate steps with a blank line.
DEFAULT_STEP_DELIMITER = "\n\n"
DEFAULT_MAX_STEP_TOKENS = 64
# The sampling a dataset run uses, as the bench measures it; the draft head trains on
# traces sampled this way too, so it learns the distribution it will be asked to match.
SAMPLING_TEMPERATURE = 0.6
SAMPLING_TOP_P = 0.95


@dataclass
class GenerationConfig:
    method: str = "semspec"
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int = 0
    # None: the step rule the loaded probes were calibrated with (probes only judge steps
    # cut the way they were trained on), else DEFAULT_STEP_DELIMITER / DEFAULT_MAX_STEP_TOKENS.
    step_delimiter: str | None = None
    max_step_tokens: int | None = None
    # semspec: reject a step whose p_T (the target probe's estimate that the target would
    # have written something of the same meaning) is below it (0 disables). None: greedy, the
    # floor the loaded probes were calibrated with (p_T's scale is each calibration's:
    # semspec.calibration.rule_eval.choose_floor), else 0; sampled, 0. Greedy the target
    # writes its likeliest meaning, and a step it rarely says is a departure the ratio rule
    # lets through; sampled, the ratio rule is what keeps the target's own spread of meanings,
    # and a floor cuts its tail (measured: docs/benchmarks.md "A floor on p_T for greedy jobs").
    tau: float | None = None
    # semspec, the paper's rule: reject a step whose p_T / p_D is below it, else accept it
    # with probability min(1, p_T / p_D), as always (0 disables the floor). 0.6 is the
    # paper's and measured more target-like than 0 on the bench (``semjobs bench --ratio-floors 0,0.6``).
    ratio_floor: float = 0.6
    # semspec: drafted steps tried per step before the target writes it. 1 is the paper's
    # rule; each retry keeps a step the probes accept instead of the target's own, trading
    # target-likeness for speed (docs/benchmarks.md, "Tried and not taken").
    draft_attempts: int = 1
    # semspec, sampling: candidate steps the draft writes side by side for each step (one
    # batch of draft requests), verified in one batch of target requests; the paper's rule is
    # applied to them in order, the one the target's probe rates most target-like first, and
    # the first accepted is kept, else the target writes the step. Greedy drafts one (the
    # candidates would be the same).
    draft_candidates: int = 1
    # token_sd: tokens drafted per verification (vLLM's num_speculative_tokens: an engine
    # drafts as many for every request, so a job's count selects its engine).
    draft_tokens: int = 4
    # step_judge: accept a drafted step when the target's 0-9 score is at least this.
    judge_threshold: int = 7
    # End-of-thinking marker: "auto" uses "</think>" when the target's vocabulary has it,
    # None or "" disables.
    think_end: str | None = "auto"
    # semspec and step_judge: who writes the answer after the marker. "target"; or "draft",
    # the paper's way: the draft's answer steps are kept unverified (no target pass).
    answer_by: str = "target"
    # semspec and step_judge: draft a step only while that is expected to cost less per token
    # than the target writing it (semspec.adaptive): the target writes the next steps itself
    # while the sequence's acceptance rate is below the break-even of these unit costs, in
    # target decoding passes (one draft pass; a verification pass's extra cost per token).
    # draft_cost None: what the running engine measures (per written, per drafted token, per
    # verification; semspec.adaptive.LiveCosts), so decisions follow the machine's speed too;
    # before it has measured, the loaded draft's (measured for the embedded drafts, else
    # estimated from the weights a pass reads). A job that sets draft_cost fixes both costs,
    # so its reruns decide alike; verify_cost_per_token is the embedded target's, measured at
    # batch 1.
    adaptive: bool = True
    draft_cost: float | None = None
    verify_cost_per_token: float = 0.066
    # semspec and step_judge: draft steps only while at most this many sequences are in
    # flight. With more, the target's pass runs on every tick for the others anyway, and a
    # drafted step saves no pass: it only adds draft passes (docs/batching.md). The target
    # writes meanwhile (steps logged with reason "batch"; on the writer where the job
    # speculates tokens, which like token_sd's engine on a CPU drafts tokens only while few
    # requests run in it: token_engine.CPU_SPECULATION_MAX_BATCH, 2), and drafting resumes
    # as the batch thins out at the end of a job.
    # None: the engine's choice (1 on a CPU, as measured; no limit on an accelerator,
    # untested); 0: no limit. Outputs then depend on the batch's occupancy.
    # The service's default: SEMJOBS_DRAFT_MAX_BATCH.
    draft_max_batch: int | None = None
    # semspec and step_judge: the target's own writing (steps it rewrites, steps written while
    # drafting pauses, answers) speculates tokens too, with the step engine's token draft
    # (vLLM's speculative decoding, lossless: semspec.engine.step_engine's writer), where the
    # engine loaded one (by default the embedded target's draft head).
    token_speculation: bool = True
    # Sampling: each request carries its sample's seed, so a rerun writes the same text. False:
    # no seeds, reruns differ; on CUDA vLLM 0.32.0 then samples a batch with FlashInfer's
    # kernels, which one seeded request in it swaps for PyTorch's sort-based top-p (docs/gpu.md).
    reproducible: bool = True
    # Extra arguments of the tokenizer's chat template (e.g. {"enable_thinking": True}).
    chat_template_kwargs: dict[str, Any] | None = None
    # End a sequence that falls into a loop (the same unit of tokens over and over) as it starts,
    # finish reason "repetition", its output cut after the loop's first copy (semspec.repetition).
    # Off here: the engine writes what the model writes; the service turns it on for its jobs
    # (SEMJOBS_STOP_LOOPS), as a looping tail is tokens no dataset keeps.
    stop_loops: bool = False
    # Stop a sampled sequence the engine's doom rule (semspec.doom, calibrated on the target's
    # own traces) says will not end right, finish reason "doomed". Off here, as stop_loops; the
    # service turns it on (SEMJOBS_STOP_DOOMED), and it acts only where an engine has a rule
    # (SEMJOBS_DOOM_RULE): any on the token engine (ar, token_sd), one of the length kind on the
    # step engines (they read no per-token log-probabilities).
    stop_doomed: bool = False


# The fields of a GenerationConfig that change how a drafting job's drafted steps fare (how
# often they are kept, what writing them instead costs): jobs alike in all of them share what
# their sequences learned (semspec.adaptive.JobExperience).
DRAFTING_FIELDS = ("method", "temperature", "top_p", "tau", "ratio_floor", "draft_attempts", "draft_candidates",
                   "judge_threshold", "step_delimiter", "max_step_tokens", "think_end", "chat_template_kwargs",
                   "token_speculation", "draft_tokens")


@dataclass
class StepRecord:
    index: int
    author: str  # "draft" (accepted drafted step) or "target" (target wrote it)
    text: str
    drafted_tokens: int  # tokens the draft proposed for this step (0 if none)
    accepted_tokens: int  # drafted tokens kept (of a rejected step: the leading ones the target drew alike)
    # "accepted", "rejected" (draft thrown away, target rewrote), "target_only" (no draft
    # involved), "draft_only" (the draft's answer after the end-of-thinking marker, kept
    # unverified: answer_by="draft") or "token_verified" (token_sd: every token checked)
    decision: str
    p_target: float | None = None
    p_draft: float | None = None
    accept_prob: float | None = None
    seconds: float = 0.0
    target_tokens: int = 0  # target-tokenizer tokens in ``text``
    draft_text: str | None = None  # the drafted step, when it was rejected
    judge_score: int | None = None  # step_judge: the target's 0-9 score
    # why the target wrote a step no draft was tried for: "backoff" (drafting was expected
    # to cost more than it saves: semspec.adaptive), "batch" (too many sequences in flight:
    # GenerationConfig.draft_max_batch), "answer" (after the end-of-thinking
    # marker), "room" (a drafted step could overflow a context), "draft_stop" (the draft
    # ended the step before writing anything); None otherwise
    reason: str | None = None


@dataclass
class Counters:
    """What one prompt's decoding did, counted alike by every engine and method:
    ``generated_tokens`` counts target-tokenizer tokens (the EOS token that ends a sequence is
    neither output nor counted); ``drafted_tokens`` / ``accepted_tokens`` count the tokens the
    draft proposed / that were kept (of a rejected step, the leading ones the target drew
    alike); a token the target adds from a verification pass is not counted as accepted;
    ``target_forward_passes`` counts every target request or pass, prefill included."""

    prompt_tokens: int = 0
    generated_tokens: int = 0  # target-tokenizer tokens in the output
    target_forward_passes: int = 0
    draft_forward_passes: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    steps_drafted: int = 0
    steps_accepted: int = 0
    # tokens generated after a loop's onset and cut from the output (stop_loops), or by a
    # sample aborted before it finished: what the sample cost beyond its text
    cut_tokens: int = 0
    # Wall-clock seconds per phase, e.g. {"draft": .., "verify": .., "target_write": ..}.
    phase_seconds: dict[str, float] = field(default_factory=dict)

    def add_time(self, phase: str, seconds: float) -> None:
        self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + seconds


# The raw counts of Counters, in order: the one list the service's stats columns, their
# inserts and the per-job sums are built from, so a new counter is one field here (and
# its migration).
COUNT_FIELDS = tuple(f.name for f in fields(Counters) if f.name != "phase_seconds")


@dataclass
class GenerationResult:
    text: str  # everything the model generated (reasoning + answer)
    final_answer: str | None  # semspec.answers.final_answer(text), when it finds one
    # semspec.answers.split_reasoning(text): keyword-only, so that fields with defaults can
    # sit here and positional constructors still work
    reasoning: str = field(default="", kw_only=True)
    content: str = field(default="", kw_only=True)  # the part that states the answer
    steps: list[StepRecord]
    counters: Counters
    wall_seconds: float
    # "eos", "length", "repetition" (a loop cut: GenerationConfig.stop_loops), "doomed" (stopped
    # by the doom rule: GenerationConfig.stop_doomed)
    finish_reason: str
    models: dict[str, str] = field(default_factory=dict)  # role -> identity (path + hash)


@dataclass
class Request:
    """One prompt for ``Engine.generate_many``: its messages (or text), an optional config
    of its own, and a key to know its result by (default: its position in the input)."""

    prompt: Any
    config: GenerationConfig | None = None
    key: Any = None


@dataclass
class Abort:
    """A marker a live request source sends after a request: stop decoding the request with
    this key (its job was cancelled). It ends at once as ``Finished(key, None, Cancelled)``,
    or not at all if it has already finished."""

    key: Any


class Cancelled(Exception):
    """The error of a request stopped by an :class:`Abort` marker; ``generated_tokens``: the
    tokens it had generated by then (spent, though no output keeps them)."""

    def __init__(self, message: str = "", generated_tokens: int = 0):
        super().__init__(message)
        self.generated_tokens = generated_tokens


def as_requests(prompts):
    """``generate_many``'s prompts as :class:`Request`: a text or message list gets its
    position as key, a Request without a key likewise; None (a live source with nothing
    ready yet) and :class:`Abort` markers pass through."""
    for i, p in enumerate(prompts):
        if p is None or isinstance(p, Abort) or (isinstance(p, Request) and p.key is not None):
            yield p
        else:
            yield Request(p.prompt, p.config, i) if isinstance(p, Request) else Request(p, key=i)


@dataclass
class Finished:
    key: Any
    result: GenerationResult | None  # None when the item failed
    error: Exception | None = None  # why it failed (a bad prompt, a context overflow, ...)

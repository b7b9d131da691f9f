"""The decoding methods at step level: what a serving engine is asked for, a step at a time.

A method is a coroutine per prompt (``Program``): it yields a :class:`Call` (the target or the
draft continues some token ids: writes up to the step's end, or reads a drafted step and
returns its states) and is sent the :class:`Reply`. It never runs a model: an engine adapter
(``semspec.engine.step_engine``) turns each call into a request of its engine and sends the reply
when the request finishes, so many prompts' calls share the engine's continuous batching, and
the engine's prefix cache makes every call after the first cost only its new tokens (a
rejected step is "rolled back" by not extending the prefix).

    ar       the target writes every step (``write_step``).
    semspec  the draft writes a step; the target reads it in one prefill, returning the probe
             layer's states over the step; the probes on both models' pooled states decide
             (``semspec.acceptance.meaning_decision``); kept, the verification's sampled
             token starts the next step; else the target writes the step itself.
    step_judge  the draft writes a step; the target reads it with a judging question after it
             and scores it 0-9 from its log-probabilities of the ten digits
             (``semspec.acceptance.judge_decision``).

Counting conventions are ``semspec.types``' (``Counters``), as ``semspec.engine.token_engine``'s,
so results compare. With ``stop_loops`` a sequence's generated ids are looked at after every
step with ``semspec.repetition``'s rule, and one that loops ends there ("repetition"), cut as
the token engine cuts it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Generator

import torch

from .acceptance import judge_decision, meaning_decision
from .adaptive import Governor, LiveCosts
from .answers import final_answer, split_reasoning
from .repetition import DEFAULT_RULE, find_loop, line_break_ids
from .sampling import make_generator
from .steps import IncrementalText, StepDetector
from .types import ANSWER_BY, Counters, GenerationConfig, GenerationResult, StepRecord

TARGET, DRAFT = "target", "draft"
# The phase of the target's own writing: a step it writes, a write-ahead (what the engine may
# speculate on at token level, GenerationConfig.token_speculation)
WRITE_PHASE = "target_write"
# While drafting is paused for the batch, the target writes this many tokens per request and
# they are cut into steps afterwards: one request per step would cost a prefill of the
# uncached tail of the prefix each (up to a KV block), and a paused method should cost what ar
# does. The batch is looked at again after each such run.
WRITE_AHEAD_TOKENS = 128


@dataclass
class Call:
    """One request to one model: continue ``ids`` by up to ``max_tokens`` tokens, stopping at
    an end-of-sequence token or, when ``stop_at_step_end``, at text that may end a step.
    ``states_from``: also return the probe layer's states of positions ``states_from`` .. the
    last one fed. ``phase`` books its time."""

    model: str
    ids: list[int]
    max_tokens: int
    phase: str
    stop_at_step_end: bool = False
    states_from: int | None = None
    scored: tuple[int, ...] = ()  # the next token is one of these: the reply carries their log-probabilities
    # the engine may end the request early where its own tokens loop (semspec.repetition's rule,
    # as vLLM's repetition detection): the program finds the loop in its ids after the reply
    stop_loops: bool = False


@dataclass
class Reply:
    tokens: list[int]
    states: torch.Tensor | None = None  # [positions, hidden] float32, when asked for
    logprobs: dict[int, float] | None = None  # of the scored tokens, normalised over them


Program = Generator[Call, Reply, None]


def side_by_side(programs: list[Generator]) -> Generator[list[Call], list[Reply], list]:
    """Run sub-programs together: each round yields the next call of every one still running
    (the engine serves them as one batch of requests) and sends each its reply; returns
    their return values, in order."""
    results: list = [None] * len(programs)
    waiting: dict[int, Call] = {}
    for i, program in enumerate(programs):
        try:
            waiting[i] = next(program)
        except StopIteration as stop:
            results[i] = stop.value
    while waiting:
        order = list(waiting)
        replies = yield [waiting[i] for i in order]
        for i, reply in zip(order, replies):
            try:
                waiting[i] = programs[i].send(reply)
            except StopIteration as stop:
                results[i] = stop.value
                del waiting[i]
    return results


@dataclass(frozen=True)
class ModelFacts:
    """What a method needs to know of a model served elsewhere."""

    tokenizer: object
    eos: frozenset[int]
    max_context: int


def common_prefix(a: list, b: list) -> int:
    """How many leading items ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class DraftedStep:
    tokens: list[int]
    end: str  # "delimiter", "think_end", "cap", "eos", "length"
    pooled: torch.Tensor | None


class StepProgram:
    """One prompt's decode at step level (``ar``); subclasses draft."""

    method = "ar"

    def __init__(self, prompt: list[int], config: GenerationConfig, target: ModelFacts, think_end: str | None,
                 identities: dict[str, str], in_flight: Callable[[], int] = lambda: 1):
        if config.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if config.answer_by not in ANSWER_BY:
            raise ValueError(f"answer_by must be one of {', '.join(ANSWER_BY)}, not {config.answer_by!r}")
        self.cfg = config
        self.target = target
        self.ids = list(prompt)
        self.prompt_len = len(prompt)
        self.budget = min(config.max_new_tokens, target.max_context - len(prompt))
        self.think_end = think_end
        self.detector = StepDetector(config.step_delimiter, think_end, config.max_step_tokens)
        self.counters = Counters(prompt_tokens=len(prompt))
        self.steps: list[StepRecord] = []
        self.phase = "think"  # -> "answer" -> "done"
        self.finish_reason: str | None = None
        self.step_start = len(prompt)
        self.identities = identities
        self.in_flight = in_flight
        self.governor: Governor | None = None
        self.tail: dict | None = None  # the open step's record (decision and fields), when a write-ahead began it
        self.loop_checked = 0  # generated tokens the loop rule has looked at (stop_loops)
        self.doom_cap: int | None = None  # tokens at which the doom rule stops it (stop_doomed)
        self.t0 = time.perf_counter()
        self._step_t0 = self.t0

    # ------------------------------------------------------------------ state
    @property
    def done(self) -> bool:
        return self.phase == "done"

    def remaining(self) -> int:
        return self.budget - (len(self.ids) - self.prompt_len)

    def finish(self, reason: str) -> None:
        if self.phase != "done":
            self.finish_reason = reason
            self.phase = "done"

    def decode(self, ids) -> str:
        return self.target.tokenizer.decode(list(ids), skip_special_tokens=False)

    def close_step(self, author: str, decision: str, drafted: int = 0, accepted: int = 0, **extra) -> None:
        end = len(self.ids)
        if end <= self.step_start and not drafted:
            return
        now = time.perf_counter()
        self.steps.append(StepRecord(index=len(self.steps), author=author, text=self.decode(self.ids[self.step_start:]),
                                     drafted_tokens=drafted, accepted_tokens=accepted, decision=decision,
                                     target_tokens=end - self.step_start, seconds=now - self._step_t0, **extra))
        if self.governor is not None:
            self.governor.observe_step(end - self.step_start)
        self.step_start, self._step_t0, self.tail = end, now, None

    def take_token(self, token: int) -> bool:
        """Append a token the target sampled; False (and finish) on end of sequence."""
        if token in self.target.eos:
            self.finish("eos")
            return False
        self.ids.append(token)
        return True

    # ------------------------------------------------------------------ steps
    def continue_step(self, model: str, facts: ModelFacts, ids: list[int], prefix: list[int], phase: str
                      ) -> Generator[Call, Reply, tuple[list[int], str]]:
        """``model`` continues ``ids`` (whose last ``len(prefix)`` tokens open the step) to the
        step's end: (its tokens, why it stopped). The engine stops at text that may end a
        step; the step rule (``StepDetector``) decides on the tokens, and the model goes on
        where the engine stopped early (a delimiter before any text) or cuts where it did not
        see the end (a delimiter spanning the prefix)."""
        text = IncrementalText(facts.tokenizer, prefix)
        tokens: list[int] = []
        while True:
            n = len(prefix) + len(tokens)
            room = min(self.cfg.max_step_tokens - n, self.remaining() - len(tokens))
            if room <= 0:
                return tokens, "cap" if n >= self.cfg.max_step_tokens else "length"
            reply = yield Call(model, ids + tokens, room, phase, stop_at_step_end=True)
            for token in reply.tokens:
                if token in facts.eos:
                    return tokens, "eos"
                tokens.append(token)
                prev = len(text.text)
                text.push(token)
                end = self.detector.ended(text.text, len(prefix) + len(tokens), prev)
                if end is not None:
                    return tokens, end.reason

    def write_step(self, decision: str, **extra) -> Program:
        """The target writes the open step itself."""
        tokens, end = yield from self.continue_step(TARGET, self.target, self.ids, self.ids[self.step_start:],
                                                    WRITE_PHASE)
        self.ids.extend(tokens)
        if end == "eos":
            self.finish("eos")
        elif end == "length":
            self.finish("length")
        elif end == "think_end":
            self.phase = "answer"
        self.close_step("target", decision, **extra)

    def write_ahead(self, tokens: int = WRITE_AHEAD_TOKENS, first: dict | None = None,
                    **extra) -> Generator[Call, Reply, int]:
        """The target writes on past step ends, ``tokens`` at most, in one request; they are
        cut into steps by the step rule, up to the end of thinking (what it wrote past that is
        dropped: the answer's steps are the answer's rule's). A step it leaves open stays open (``tail``):
        the next write-ahead goes on with it, and before the draft writes a step the target
        finishes it (``DraftingProgram.advance``), so drafting starts at a step's beginning,
        as after any step the target writes. ``first``: the record (``decision`` and fields) of
        the first step it closes, where that is not a plain target step (a rejected draft's,
        the target writing it); an open step it goes on with keeps its own record; the others'
        are ``extra``. Returns how many steps it closed."""
        # (a loop in what it writes ends the request there: stop_loop finds it after)
        reply = yield Call(TARGET, self.ids, max(1, min(self.remaining(), tokens)), WRITE_PHASE,
                           stop_loops=self.cfg.stop_loops)
        before = len(self.steps)
        plain = {"decision": "target_only", **extra}
        opening = first or self.tail  # the first step's record, where it is not ``plain``

        def close() -> None:
            nonlocal opening
            self.close_step("target", **(opening or plain))
            opening = None

        written = self.ids[self.step_start:] + reply.tokens
        del self.ids[self.step_start:]
        text = IncrementalText(self.target.tokenizer)
        for token in written:
            if not self.take_token(token):
                break
            prev = len(text.text)
            text.push(token)
            end = self.detector.ended(text.text, len(self.ids) - self.step_start, prev)
            if end is not None:
                close()
                if end.reason == "think_end":
                    self.phase = "answer"
                    break
                text = IncrementalText(self.target.tokenizer)
        if self.remaining() <= 0:
            self.finish("length")
        if self.done:
            # (a rejected draft is logged even where the target wrote nothing before its end)
            if len(self.ids) > self.step_start or (first is not None and opening is not None):
                close()
        elif len(self.ids) > self.step_start:
            self.tail = opening or plain
        return len(self.steps) - before

    def advance(self) -> Program:
        yield from self.write_step("target_only")

    def stop_loop(self) -> bool:
        """With ``stop_loops``: when the generated ids have fallen into a loop since the last
        look, cut them after its first copy (``semspec.repetition.find_loop``) and finish
        ("repetition")."""
        if not self.cfg.stop_loops:
            return False
        generated = self.ids[self.prompt_len:]
        cut = find_loop(generated, DEFAULT_RULE, self.loop_checked, line_break_ids(self.target.tokenizer))
        self.loop_checked = len(generated)
        if cut is None:
            return False
        self.cut_and_finish(cut, "repetition")
        return True

    def stop_doomed(self) -> bool:
        """With a ``doom_cap`` (a doom rule of the length kind, ``semspec.doom``: the engine sets it
        for a sampled job that asks, ``GenerationConfig.stop_doomed``): once the sequence has
        more than that many tokens, cut it there and finish ("doomed"), as the token engine
        stops it at that token (an end of sequence later in the same step came after it)."""
        if self.doom_cap is None or len(self.ids) - self.prompt_len < self.doom_cap:
            return False
        self.cut_and_finish(self.doom_cap, "doomed")
        return True

    def cut_and_finish(self, cut: int, reason: str) -> None:
        """Keep the first ``cut`` generated tokens and finish with ``reason``: steps wholly
        before the cut stay, the one it falls in is cut short (its text and tokens), later ones
        go; the open step's kept part closes as it was begun. The tokens cut count as
        ``cut_tokens``."""
        end = self.prompt_len + cut
        self.counters.cut_tokens += len(self.ids) - end
        del self.ids[end:]
        kept, start = [], self.prompt_len
        for step in self.steps:
            if start >= end:
                break
            if start + step.target_tokens > end:
                n = end - start
                step = dataclasses.replace(step, text=self.decode(self.ids[start:end]), target_tokens=n,
                                           accepted_tokens=min(step.accepted_tokens, n))
            kept.append(step)
            start += step.target_tokens
        self.steps = kept
        self.step_start = min(self.step_start, end)
        if len(self.ids) > self.step_start:
            self.close_step("target", **(self.tail or {"decision": "target_only"}))
        self.tail = None
        # over a cap or an end the same reply reached: the cut came before them
        self.finish_reason, self.phase = reason, "done"

    def program(self) -> Program:
        while not self.done:
            if self.remaining() <= 0:
                self.finish("length")
                break
            yield from self.advance()
            if not self.stop_loop():
                self.stop_doomed()
        if len(self.ids) > self.step_start:
            self.close_step("target", "target_only")

    def result(self) -> GenerationResult:
        c = self.counters
        c.generated_tokens = len(self.ids) - self.prompt_len
        text = self.target.tokenizer.decode(self.ids[self.prompt_len:], skip_special_tokens=True)
        reasoning, content = split_reasoning(text, self.think_end)
        return GenerationResult(text=text, final_answer=final_answer(text, self.think_end), reasoning=reasoning,
                                content=content, steps=list(self.steps), counters=c,
                                wall_seconds=time.perf_counter() - self.t0,
                                finish_reason=self.finish_reason or "length", models=dict(self.identities))


class DraftingProgram(StepProgram):
    """What the methods that draft steps share; the draft shares the target's tokenizer."""

    def __init__(self, prompt, config, target, think_end, identities, in_flight=lambda: 1, *, draft: ModelFacts,
                 live_costs: LiveCosts | None = None):
        """``live_costs``: the engine's measured costs, which the adaptive rule then decides on
        instead of the config's (``semspec.adaptive``)."""
        super().__init__(prompt, config, target, think_end, identities, in_flight)
        if config.draft_max_batch is not None and config.draft_max_batch < 0:
            raise ValueError("draft_max_batch must be at least 0 (0: no limit)")
        if config.draft_attempts < 1:
            raise ValueError("draft_attempts must be at least 1")
        if config.draft_candidates < 1:
            raise ValueError("draft_candidates must be at least 1")
        if config.adaptive and (config.draft_cost < 0 or config.verify_cost_per_token < 0):
            raise ValueError("draft_cost and verify_cost_per_token must be at least 0")
        self.draft = draft
        if config.adaptive:
            self.governor = Governor(config.draft_cost, config.verify_cost_per_token, live_costs)

    def draft_out_of_room(self, extra: int = 0) -> bool:
        room = len(self.ids) + self.cfg.max_step_tokens + 8
        return room > self.draft.max_context or room + extra > self.target.max_context

    def advance(self) -> Program:
        cfg = self.cfg
        drafting = not (self.phase == "answer" and cfg.answer_by != "draft") and not self.draft_out_of_room() \
            and not (cfg.draft_max_batch and self.in_flight() > cfg.draft_max_batch)
        if self.tail is not None and drafting and (self.governor is None or self.governor.waiting == 0):
            # the draft would continue a step a write-ahead began: the target finishes it
            yield from self.write_step(**self.tail)
        elif self.phase == "answer" and cfg.answer_by == "draft" and not self.draft_out_of_room():
            yield from self.draft_write_step()
        elif self.phase == "answer" or self.draft_out_of_room():
            yield from self.write_step("target_only", reason="answer" if self.phase == "answer" else "room")
        elif cfg.draft_max_batch and self.in_flight() > cfg.draft_max_batch:
            yield from self.write_ahead(reason="batch")
        elif self.governor is not None and not self.governor.should_speculate():
            # the back-off's steps in one request, as many tokens as that many steps take (about:
            # the steps they make count against the back-off, a step left open with it)
            steps = self.governor.waiting + 1
            closed = yield from self.write_ahead(round(steps * self.governor.step_tokens), reason="backoff")
            self.governor.skip(closed - 1)
        else:
            yield from self.speculate_step()

    def speculate_step(self) -> Program:
        raise NotImplementedError

    def draft_step(self, tap: bool = False) -> Generator[Call, Reply, DraftedStep]:
        """The draft writes the rest of the open step; with ``tap``, its pooled states over the
        whole step (its opening tokens too) from one more read of it (the last drafted
        token is never fed while drafting)."""
        prefix = self.ids[self.step_start:]
        tokens, end = yield from self.continue_step(DRAFT, self.draft, self.ids, prefix, "draft")
        pooled = None
        if tap and tokens:
            reply = yield Call(DRAFT, self.ids + tokens, 1, "draft", states_from=self.step_start)
            pooled = self.pool_states(DRAFT, reply.states)
        return DraftedStep(tokens, end, pooled)

    def drafted(self, step: DraftedStep, thrown: int = 0) -> Generator[Call, Reply, bool]:
        """Count a drafted step; False when there is none and the target wrote the step
        itself (``thrown``: drafted tokens of earlier, rejected attempts at it)."""
        if not step.tokens:
            if thrown:
                yield from self.write_step("rejected", drafted=thrown)
            else:
                yield from self.write_step("target_only", reason="draft_stop")
            return False
        self.counters.steps_drafted += 1
        self.counters.drafted_tokens += len(step.tokens)
        return True

    def keep(self, step: DraftedStep, bonus: list[int], thrown: int, record: dict) -> None:
        """Keep a verified step; the target's token sampled after it starts the next."""
        if self.governor is not None:
            self.governor.observe_verification(True)
        c = self.counters
        c.steps_accepted += 1
        c.accepted_tokens += len(step.tokens)
        self.ids.extend(step.tokens)
        self.close_step("draft", "accepted", drafted=len(step.tokens) + thrown, accepted=len(step.tokens), **record)
        if step.end == "think_end":
            self.phase = "answer"
        if self.remaining() <= 0:
            self.finish("length")
        elif bonus:
            self.take_token(bonus[0])

    def reject(self, step: DraftedStep, thrown: int, record: dict) -> Program:
        """The target writes the step instead; of the drafted tokens, those it wrote alike
        (but for the step's last) count as kept. When the rejection makes the sequence back
        off, the step and the back-off's steps are written in one request (a request more
        would cost a prefill of its uncached tail and a first pass with nothing drafted)."""
        rejected = dict(decision="rejected", drafted=len(step.tokens) + thrown, draft_text=self.decode(step.tokens),
                        **record)
        pre, start, index = len(self.ids), self.step_start, len(self.steps)
        if self.governor is not None:
            self.governor.observe_verification(False)
        if self.governor is not None and self.governor.waiting and self.phase == "think":
            # as many tokens as the step and the back-off's take, and at least a whole step (it closes)
            steps = self.governor.waiting + 1
            tokens = max(round(steps * self.governor.step_tokens), self.cfg.max_step_tokens)
            closed = yield from self.write_ahead(tokens, first=rejected, reason="backoff")
            self.governor.skip(max(0, closed - 1))
        else:
            yield from self.write_step(**rejected)
        if len(self.steps) > index:  # (else still open: a reply shorter than asked, without its end)
            written = self.steps[index]
            kept = common_prefix(self.ids[pre:start + written.target_tokens], step.tokens[:-1])
            self.counters.accepted_tokens += kept
            written.accepted_tokens = kept

    def draft_write_step(self) -> Program:
        """A step of the answer written by the draft and kept unverified ("draft_only")."""
        step = yield from self.draft_step()
        eos_at = next((i for i, t in enumerate(step.tokens) if t in self.target.eos), None)
        if eos_at is not None:  # the target's end of sequence, in the draft's text
            step = DraftedStep(step.tokens[:eos_at], "eos", None)
        self.ids.extend(step.tokens)
        self.close_step("draft", "draft_only", drafted=len(step.tokens), accepted=len(step.tokens))
        if step.end == "eos":
            self.finish("eos")
        elif self.remaining() <= 0 or not step.tokens:
            self.finish("length")


class SemSpecProgram(DraftingProgram):
    method = "semspec"

    def __init__(self, prompt, config, target, think_end, identities, in_flight=lambda: 1, *, draft: ModelFacts,
                 probes, pool_states: Callable[[str, torch.Tensor], torch.Tensor], live_costs: LiveCosts | None = None):
        """``pool_states(model, rows)``: the probe's features of a step from the states the
        engine returned for it (``semspec.engine.step_engine``)."""
        super().__init__(prompt, config, target, think_end, identities, in_flight, draft=draft, live_costs=live_costs)
        self.probes = probes
        self.pool_states = pool_states
        self.coin = make_generator(config.seed + 1_000_003, "cpu")

    def speculate_step(self) -> Program:
        cfg = self.cfg
        thrown = 0
        sampled = cfg.temperature > 0  # greedy drafts the same step again
        attempts, candidates = (cfg.draft_attempts, cfg.draft_candidates) if sampled else (1, 1)
        for attempt in range(1, attempts + 1):
            if candidates == 1:
                steps = [(yield from self.draft_step(tap=True))]
            else:
                drafts = yield from side_by_side([self.draft_step(tap=True) for _ in range(candidates)])
                steps = [s for s in drafts if s.tokens] or drafts[:1]
            if not (yield from self.drafted(steps[0], thrown)):
                return
            for other in steps[1:]:  # drafted side by side: drafted work all the same
                self.counters.drafted_tokens += len(other.tokens)
            calls = [Call(TARGET, self.ids + s.tokens, 1, "verify", states_from=self.step_start) for s in steps]
            replies = [(yield calls[0])] if len(calls) == 1 else (yield from side_by_side([_one(c) for c in calls]))
            drafted = sum(len(s.tokens) for s in steps)  # a step's drafted tokens: every candidate's
            read = [(step, reply, self.pool_states(TARGET, reply.states)) for step, reply in zip(steps, replies)]
            if len(read) > 1:  # the one the target's probe finds most like the target's own is tried first
                read.sort(key=lambda r: -self.probes.target.predict(r[2]))
            steps = [step for step, _, _ in read]
            first_record = None
            for step, reply, pooled in read:
                accepted, record = meaning_decision(self.probes, pooled, step.pooled, cfg, self.coin)
                if accepted:
                    self.keep(step, reply.tokens, thrown + drafted - len(step.tokens), record)
                    return
                first_record = first_record or record
            if attempt == attempts:  # the target writes the step; the first candidate is its draft
                yield from self.reject(steps[0], thrown + drafted - len(steps[0].tokens), first_record)
                return
            thrown += drafted


def _one(call: Call) -> Generator[Call, Reply, Reply]:
    """A single call as a sub-program (``side_by_side``)."""
    return (yield call)


class StepJudgeProgram(DraftingProgram):
    """SpecReason-style: the target scores each drafted step 0-9, read from its log-probabilities
    of the ten digits after a judging question (one prefill; ``semspec.prompts.judge_suffix``)."""

    method = "step_judge"

    def __init__(self, prompt, config, target, think_end, identities, in_flight=lambda: 1, *, draft: ModelFacts,
                 suffix: list[int], digits: tuple[int, ...], live_costs: LiveCosts | None = None):
        super().__init__(prompt, config, target, think_end, identities, in_flight, draft=draft, live_costs=live_costs)
        self.suffix = suffix
        self.digits = digits

    def draft_out_of_room(self, extra: int = 0) -> bool:
        return super().draft_out_of_room(extra + len(self.suffix))

    def speculate_step(self) -> Program:
        step = yield from self.draft_step()
        if not (yield from self.drafted(step)):
            return
        judged = yield Call(TARGET, self.ids + step.tokens + self.suffix, 1, "judge", scored=self.digits)
        accepted, record = judge_decision(torch.tensor([judged.logprobs[d] for d in self.digits]),
                                          self.cfg.judge_threshold)
        if accepted:  # the target's token after the step (its prefix is cached by now)
            bonus = yield Call(TARGET, self.ids + step.tokens, 1, "verify")
            self.keep(step, bonus.tokens, 0, record)
        else:
            yield from self.reject(step, 0, record)


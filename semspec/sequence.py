"""Per-sequence decoding state and the small step functions that drive it.

Each method is a :class:`Sequence` subclass holding everything one prompt needs (token
streams on runner slots, phase, counters, step records, random generators). Its
``program()`` is a generator, the method's state machine: it never runs a model, it yields
the forward passes it needs (:class:`semspec.stream.PassRequest`) and is sent their results.
The scheduler (``semspec.scheduler``) collects the requests of every active sequence and
runs each model once per tick over all of them, so a method reads as straight-line code
(``out = yield from self.T.forward(...)``) while many sequences share every pass.

Conventions:
- Budget and ``Counters.generated_tokens`` count target-tokenizer tokens; the EOS token that
  ends a sequence is not part of the output and not counted.
- ``drafted_tokens`` / ``accepted_tokens`` count draft-tokenizer tokens the draft proposed /
  that were kept; of a rejected step, the leading tokens the target drew alike count as kept
  (in target tokens; the same count when the pair shares a tokenizer). Bonus tokens (sampled
  by the target from a verification pass) are not counted as accepted;
  ``target_forward_passes`` counts every target pass, prefill included.
- A step's ``text`` is the target's text for it (a bonus token starts the next step).
- ``Counters.phase_seconds`` books the wall time of every batched pass a sequence took part
  in under the phase it asked for (a shared pass counts in full for each participant).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Generator

import torch

from .answers import final_answer, split_reasoning
from .models import encode_prompt
from .probes import pool
from .sampling import make_generator, probs_from_logits, sample, sample_logits, sample_rows, uniform
from .steps import IncrementalText, StepDetector
from .adaptive import Governor
from .head import is_head
from .stepwise import common_prefix, judge_decision, meaning_decision
from .prompts import MethodUnavailable, PromptError, judge_prompt, prompt_ids
from .stream import HeadStream, PassRequest, PassResult, Sample, Stream
from .types import ANSWER_BY, Counters, GenerationConfig, GenerationResult, StepRecord

Program = Generator[PassRequest, PassResult, None]

# A verification pass also keeps the target's logits for the FOLLOW_ROWS positions after the
# drafted step's first (whose logits it kept already, for the target's first draw after a
# rejection), so that the target's own first draws along a rejected step need no pass each
# (``DraftingSequence.follow_rejected``). Each costs one more row of the LM head in a pass
# that runs it anyway; a run of draws equal to the draft's rarely outlasts a few tokens
# (docs/benchmarks.md, "Rejected steps keep the target's own tokens").
FOLLOW_ROWS = 4


class Sequence:
    method = "ar"

    def __init__(self, engine, messages, config: GenerationConfig, runners):
        self.engine = engine
        self.cfg = config
        self.t0 = time.perf_counter()
        tgt = engine.target
        max_ctx = tgt.max_context
        prompt = prompt_ids(tgt.tokenizer, messages, config.chat_template_kwargs, max_ctx)
        if config.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if config.draft_attempts < 1:
            raise ValueError("draft_attempts must be at least 1")
        if config.answer_by not in ANSWER_BY:
            raise ValueError(f"answer_by must be one of {', '.join(ANSWER_BY)}, not {config.answer_by!r}")
        self.prompt_len = len(prompt)
        self.T = Stream(runners.target, prompt)
        self.budget = config.max_new_tokens if max_ctx is None else min(config.max_new_tokens, max_ctx - len(prompt))
        te = config.think_end
        self.think_end = engine.think_end_marker if te == "auto" else (te or None)
        self.detector = StepDetector(config.step_delimiter, self.think_end, config.max_step_tokens)
        self.counters = Counters(prompt_tokens=len(prompt))
        self.steps: list[StepRecord] = []
        self.phase = "prefill"  # -> "think" -> "answer" -> "done"
        self.finish_reason: str | None = None
        self.eos = tgt.eos_token_ids
        self.rng = make_generator(config.seed, tgt.device)
        self.target_sample = Sample(config.temperature, config.top_p, self.rng)
        self.coin = make_generator(config.seed + 1_000_003, "cpu")
        self.step_start = self.prompt_len  # absolute position in T where the open step began
        self._step_t0 = time.perf_counter()
        self._scan_text: IncrementalText | None = None  # token_sd: the open step's text so far
        self._step_drafted = 0
        self._step_accepted = 0
        self.governor: Governor | None = None  # methods that draft steps set one
        self.in_flight: Callable[[], int] = lambda: 1  # sequences decoding beside it (the scheduler's)

    @property
    def streams(self) -> list[Stream]:
        return [self.T]

    # ------------------------------------------------------------------ helpers
    @property
    def done(self) -> bool:
        return self.phase == "done"

    def generated(self) -> int:
        return len(self.T.ids) - self.prompt_len

    def remaining(self) -> int:
        return self.budget - self.generated()

    def decode_t(self, ids) -> str:
        return self.T.lm.tokenizer.decode(list(ids), skip_special_tokens=False)

    def finish(self, reason: str) -> None:
        if self.phase != "done":
            self.finish_reason = reason
            self.phase = "done"

    def close_step(self, author: str, decision: str, drafted: int = 0, accepted: int = 0,
                   end: int | None = None, **extra) -> StepRecord | None:
        end = len(self.T.ids) if end is None else end
        if end <= self.step_start and not drafted:
            return None
        rec = StepRecord(
            index=len(self.steps),
            author=author,
            text=self.decode_t(self.T.ids[self.step_start:end]),
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            decision=decision,
            target_tokens=end - self.step_start,
            seconds=time.perf_counter() - self._step_t0,
            **extra,
        )
        self.steps.append(rec)
        if self.governor is not None:
            self.governor.observe_step(rec.target_tokens)
        self.step_start = end
        self._scan_text = None
        self._step_t0 = time.perf_counter()
        return rec

    def prefill(self) -> Program:
        yield from self.T.forward(keep_for=[], phase="prefill")
        self.phase = "think"

    def take_target_token(self, tok: int) -> bool:
        """Append a target-sampled token; False (and finish) on EOS."""
        if tok in self.eos:
            self.finish("eos")
            return False
        self.T.append([tok])
        return True

    def target_write_step(self, decision: str, first: int | None = None, **extra) -> Program:
        """The target writes the open step itself, token by token, until the step ends.
        ``first``: its next token, already drawn."""
        text = IncrementalText(self.T.lm.tokenizer, self.T.ids[self.step_start:])
        n = len(self.T.ids) - self.step_start
        end = None
        while True:
            if self.remaining() <= 0:
                self.finish("length")
                break
            if first is not None:
                tok, first = first, None
            else:
                tok = yield from self.T.next_token(self.target_sample, phase="target_write")
            if not self.take_target_token(tok):
                break
            n += 1
            prev_len = len(text.text)
            text.push(tok)
            end = self.detector.ended(text.text, n, prev_len)
            if end is not None:
                break
        if end is not None and end.reason == "think_end":
            self.phase = "answer"
        self.close_step("target", decision, **extra)

    def scan_steps(self, author: str, decision: str, final: bool = False) -> None:
        """Close steps over tokens already in T (token_sd writes several tokens per round)."""
        ids = self.T.ids
        if self._scan_text is None:
            self._scan_text = IncrementalText(self.T.lm.tokenizer)
        scan = self._scan_text
        while self.step_start + len(scan.ids) < len(ids):
            prev_len = len(scan.text)
            scan.push(ids[self.step_start + len(scan.ids)])
            end = self.detector.ended(scan.text, len(scan.ids), prev_len)
            if end is not None:
                self.close_step(author, decision, self._step_drafted, self._step_accepted,
                                end=self.step_start + len(scan.ids))
                self._step_drafted = self._step_accepted = 0
                if end.reason == "think_end" and self.phase != "done":
                    self.phase = "answer"
                scan = self._scan_text = IncrementalText(self.T.lm.tokenizer)
        if final and len(ids) > self.step_start:
            self.close_step(author, decision, self._step_drafted, self._step_accepted)

    # ------------------------------------------------------------------ driving
    def program(self) -> Program:
        """The whole decode of this prompt, as the passes it asks for."""
        yield from self.prefill()
        while not self.done:
            yield from self.advance()
        self.close_open_step()

    def advance(self) -> Program:
        """One unit of work: a reasoning step, or one speculation round."""
        raise NotImplementedError

    def close_open_step(self) -> None:
        if len(self.T.ids) > self.step_start:  # e.g. a bonus token drawn at the very end
            self.close_step("target", "target_only")

    def result(self) -> GenerationResult:
        c = self.counters
        c.generated_tokens = self.generated()
        c.target_forward_passes = self.T.forward_passes
        d = getattr(self, "D", None)
        c.draft_forward_passes = d.forward_passes if d is not None else 0
        text = self.T.lm.tokenizer.decode(self.T.ids[self.prompt_len:], skip_special_tokens=True)
        reasoning, content = split_reasoning(text, self.think_end)
        return GenerationResult(
            text=text,
            final_answer=final_answer(text, self.think_end),
            reasoning=reasoning,
            content=content,
            steps=list(self.steps),
            counters=c,
            wall_seconds=time.perf_counter() - self.t0,
            finish_reason=self.finish_reason or "length",
            models=dict(self.engine.identities),
        )


class ARSequence(Sequence):
    """Target only, one step (a run of tokens up to the step end) per ``advance``."""

    method = "ar"

    def advance(self) -> Program:
        yield from self.target_write_step("target_only")


@dataclass
class DraftedStep:
    tokens: list[int]  # draft-tokenizer tokens drafted after the step's prefix
    text: str  # their text
    end: str  # "delimiter", "think_end", "cap", "eos", "length"
    pooled: torch.Tensor | None  # draft's pooled states over the whole step (prefix + tokens)


class DraftingSequence(Sequence):
    """Shared by the methods that use a draft: a second stream mirrored onto the target's
    accepted text, in token ids (same tokenizer) or in text (different tokenizers)."""

    def __init__(self, engine, messages, config, runners):
        super().__init__(engine, messages, config, runners)
        if engine.draft is None:
            raise MethodUnavailable(engine.method_problem(self.method))
        self.draft = engine.draft
        self.same_tok = engine.same_tokenizer
        if self.same_tok:
            d_prompt = list(self.T.ids)
        else:
            d_prompt = encode_prompt(self.draft.tokenizer, messages, config.chat_template_kwargs)
            dmax = self.draft.max_context
            if dmax is not None and len(d_prompt) >= dmax:
                raise PromptError(f"prompt of {len(d_prompt)} tokens does not fit the draft's context of {dmax}")
        self.head = is_head(self.draft)  # a draft head reads the target's states (semspec.head)
        self.D = HeadStream(runners.draft, d_prompt, self.T) if self.head else Stream(runners.draft, d_prompt)
        self.d_eos = self.draft.eos_token_ids
        self.rng_d = make_generator(config.seed + 7, self.draft.device)
        self.draft_sample = Sample(config.temperature, config.top_p, self.rng_d)
        # text mirror (different tokenizers): chars of target output represented in D, and
        # checkpoints (chars, draft length) to roll back to
        self.d_text = ""
        self.d_marks: list[tuple[int, int]] = [(0, len(d_prompt))]
        if config.draft_max_batch is not None and config.draft_max_batch < 0:
            raise ValueError("draft_max_batch must be at least 0 (0: no limit)")
        if config.adaptive:
            if config.draft_cost < 0 or config.verify_cost_per_token < 0:
                raise ValueError("draft_cost and verify_cost_per_token must be at least 0")
            self.governor = Governor(config.draft_cost, config.verify_cost_per_token)

    @property
    def streams(self) -> list[Stream]:
        return [self.T, self.D]

    def prefill(self) -> Program:
        yield from self.T.forward(keep_for=[], phase="prefill")
        if not self.head:  # a head reads the prompt with the target's states at its first draft
            yield from self.D.forward(keep_for=[], phase="prefill")
        self.phase = "think"

    def sync_draft(self, upto: int) -> int:
        """Make D represent exactly the target's ``T.ids[:upto]``; returns D's length."""
        if self.same_tok:
            want = self.T.ids[:upto]
            common = min(common_prefix(self.D.ids, want), self.D.reusable)
            self.D.truncate(common)
            self.D.append(want[common:])
            if self.head:  # states before what both caches hold and the open step are not read again
                before = min(self.D.cached, self.step_start) - 1
                self.T.drop_states_before(before)
                self.D.drop_states_before(before)
            return len(self.D.ids)
        text = self.decode_t(self.T.ids[self.prompt_len:upto])
        common = len(self.d_text)
        if not text.startswith(self.d_text):
            common = common_prefix(list(self.d_text), list(text))
        while self.d_marks[-1][0] > common:
            self.d_marks.pop()
        chars, dlen = self.d_marks[-1]
        self.D.truncate(dlen)
        self.d_text = self.d_text[:chars]
        rest = text[chars:]
        if rest:
            self.D.append(self.draft.tokenizer(rest, add_special_tokens=False)["input_ids"])
            self.d_text += rest
            self.d_marks.append((len(self.d_text), len(self.D.ids)))
        return len(self.D.ids)

    def mark_draft_accepted(self, step_text: str) -> None:
        if not self.same_tok:
            self.d_text += step_text
            self.d_marks.append((len(self.d_text), len(self.D.ids)))

    def draft_step(self, tap: bool = False) -> Generator[PassRequest, PassResult, DraftedStep]:
        """The draft samples the rest of the open step (its prefix, e.g. a bonus token, is
        already in T). With ``tap`` it also returns its pooled states over the step."""
        cfg = self.cfg
        d_step_start = self.sync_draft(self.step_start)
        self.sync_draft(len(self.T.ids))
        if self.D.next_logits is None and not self.D.pending:
            # another attempt at the same step: the draft's cache holds the step's prefix, but
            # its states and next-token logits went with the rejected attempt: run it again
            self.D.refeed_from(min(d_step_start, len(self.D.ids) - 1))
        n_prefix = len(self.T.ids) - self.step_start
        text = IncrementalText(self.draft.tokenizer, prefix=self.decode_t(self.T.ids[self.step_start:]))
        rows: list[torch.Tensor] = []

        def collect(out):
            if out.hidden is not None:
                skip = max(0, d_step_start - out.start)
                rows.append(out.hidden[skip:])

        end = "cap"
        while True:
            if n_prefix + len(text.ids) >= cfg.max_step_tokens:
                end = "cap"
                break
            if len(text.ids) >= self.remaining():
                end = "length"
                break
            if self.D.next_logits is None:
                out = yield from self.D.forward(hidden=tap, keep_for=[], phase="draft", sample=self.draft_sample)
                collect(out)
                tok = out.token
            else:  # logits kept from an earlier pass (after a rollback)
                tok = sample_logits(self.D.next_logits, cfg.temperature, cfg.top_p, self.rng_d)
            if tok in self.d_eos:
                end = "eos"
                break
            self.D.append([tok])
            prev_len = len(text.text)
            text.push(tok)
            e = self.detector.ended(text.text, n_prefix + len(text.ids), prev_len)
            if e is not None:
                end = e.reason
                break
        toks = list(text.ids)
        pooled = None
        if tap and toks:
            if self.D.pending:  # the last token's states too
                collect((yield from self.D.forward(hidden=True, keep_for=[], phase="draft")))
            pooled = pool(torch.cat(rows, 0).unsqueeze(0))[0]
        return DraftedStep(toks, text.text[len(text.prefix):], end, pooled)

    def target_tokens_for(self, step: DraftedStep) -> list[int]:
        if self.same_tok:
            ids = list(step.tokens)
        else:
            ids = self.T.lm.tokenizer(step.text, add_special_tokens=False)["input_ids"]
        return ids[: max(0, self.remaining())]

    def draft_for_target(self, tap: bool = False, thrown: int = 0
                         ) -> Generator[PassRequest, PassResult, tuple[DraftedStep, list[int]] | None]:
        """Draft one step and tokenize it for the target. None when the target has written
        the step itself instead: the draft wants to stop, or nothing of its step fits.
        ``thrown``: drafted tokens of earlier, rejected attempts at this step."""
        step = yield from self.draft_step(tap=tap)
        if step.tokens:
            self.counters.steps_drafted += 1
            self.counters.drafted_tokens += len(step.tokens)
            t_ids = self.target_tokens_for(step)
            if t_ids:
                return step, t_ids
        if thrown:
            yield from self.target_write_step("rejected", drafted=thrown)
        else:
            yield from self.target_write_step("target_only", reason="draft_stop")
        return None

    def settle(self, step: DraftedStep, t_ids: list[int], pre: int, accepted: bool, record: dict,
               thrown: int = 0) -> Program:
        """Keep a verified drafted step, or drop it (the target's cache back to ``pre``
        tokens) and let the target write the step itself. ``thrown``: drafted tokens of
        earlier attempts at this step, already thrown away."""
        if self.governor is not None:
            self.governor.observe_verification(accepted)
        if accepted:
            self.after_accept(step, t_ids, thrown=thrown, **record)
            return
        kept, first = self.follow_rejected(t_ids, pre)
        self.counters.accepted_tokens += kept
        yield from self.target_write_step("rejected", first=first, draft_text=step.text, **record)
        # the drafted tokens went (but for the ones the target drew alike): record them on
        # the target-written step
        if self.steps:
            self.steps[-1].drafted_tokens = len(step.tokens) + thrown
            self.steps[-1].accepted_tokens = kept

    def follow_positions(self, pre: int, t_ids: list[int]) -> list[int]:
        """The positions whose predicting logits a verification of ``t_ids`` (appended after
        ``pre`` tokens) keeps for ``follow_rejected``."""
        return [pre + i for i in range(min(FOLLOW_ROWS, len(t_ids) - 1) + 1)]

    def follow_rejected(self, t_ids: list[int], pre: int) -> tuple[int, int | None]:
        """After a rejected step: the target's own next draws, taken from the logits the
        verification pass kept (``follow_positions``) for as long as each equals the drafted
        token there. Each draw is the one ``target_write_step`` would make (same logits,
        same generator), so the text is the target's own, as without this; only the passes
        are saved. T keeps the matching tokens; returns how many, and the first draw that
        differs from the draft (None when the kept logits ran out first). The step's last
        drafted token is never followed: a step the target wrote exactly as drafted would
        end here, which ``target_write_step`` sees only for tokens it draws itself."""
        kept, first = 0, None
        while kept < len(t_ids) - 1:
            lg = self.T.logits_before(pre + kept)
            if lg is None:
                break
            tok = sample_rows(lg[None], [self.target_sample])[0]  # as Stream.next_token draws
            if tok != t_ids[kept]:
                first = tok
                break
            kept += 1
        self.T.truncate(pre + kept)
        return kept, first

    def after_accept(self, step: DraftedStep, t_ids: list[int], thrown: int = 0, **record) -> None:
        """Keep an accepted drafted step, then draw the bonus token from the same pass."""
        self.mark_draft_accepted(step.text)
        c = self.counters
        c.steps_accepted += 1
        c.accepted_tokens += len(step.tokens)
        self.close_step("draft", "accepted", drafted=len(step.tokens) + thrown, accepted=len(step.tokens), **record)
        if step.end == "think_end":
            self.phase = "answer"
        if self.remaining() <= 0:
            self.finish("length")
            return
        lg = self.T.next_logits
        if lg is not None:
            self.take_target_token(sample_logits(lg, self.cfg.temperature, self.cfg.top_p, self.rng))

    def advance(self) -> Program:
        if self.remaining() <= 0:
            return self.finish("length")
        if self.phase == "answer" and self.cfg.answer_by == "draft" and not self.draft_out_of_room():
            yield from self.draft_write_step()
            return
        if self.phase == "answer" or self.draft_out_of_room():
            yield from self.target_write_step("target_only", reason="answer" if self.phase == "answer" else "room")
            return
        if self.cfg.draft_max_batch and self.in_flight() > self.cfg.draft_max_batch:
            yield from self.target_write_step("target_only", reason="batch")
            return
        if self.governor is not None and not self.governor.should_speculate():
            yield from self.target_write_step("target_only", reason="backoff")
            return
        yield from self.speculate_step()

    def draft_write_step(self) -> Program:
        """One step of the answer written by the draft and kept unverified (the paper's way
        after the end-of-thinking marker): no target pass; the step log says "draft_only".
        It counts in neither the drafted nor the accepted steps, which are verified ones."""
        step = yield from self.draft_step()
        t_ids = self.target_tokens_for(step)
        eos_at = next((i for i, t in enumerate(t_ids) if t in self.eos), None)
        if eos_at is not None:  # the target's end of sequence, in the draft's text
            t_ids, step.end = t_ids[:eos_at], "eos"
        self.T.append(t_ids)
        self.mark_draft_accepted(step.text)
        self.close_step("draft", "draft_only", drafted=len(step.tokens), accepted=len(step.tokens))
        if step.end == "eos":
            self.finish("eos")
        elif self.remaining() <= 0 or not t_ids:
            self.finish("length")

    def draft_out_of_room(self, extra: int = 0) -> bool:
        """True when drafting one more step could overflow either model's context
        (the draft's may be shorter; step_judge adds its question): the target writes."""
        room = self.cfg.max_step_tokens + 8
        dmax, tmax = self.draft.max_context, self.T.lm.max_context
        d_len = len(self.D.ids) + (len(self.T.ids) - self.step_start) + room
        return (dmax is not None and d_len > dmax) or (tmax is not None and len(self.T.ids) + room + extra > tmax)

    def speculate_step(self) -> Program:
        raise NotImplementedError


class SemSpecSequence(DraftingSequence):
    """SemanticSpec: draft a step, verify its meaning with probes on both models' states."""

    method = "semspec"

    def __init__(self, engine, messages, config, runners):
        super().__init__(engine, messages, config, runners)
        if engine.probes is None:
            raise MethodUnavailable(engine.method_problem(self.method))
        self.probes = engine.probes

    def speculate_step(self) -> Program:
        thrown = 0
        # a greedy draft would draft the very same step again: one attempt
        attempts = self.cfg.draft_attempts if self.cfg.temperature > 0 else 1
        for attempt in range(1, attempts + 1):
            drafted = yield from self.draft_for_target(tap=True, thrown=thrown)
            if drafted is None:  # the target wrote the step
                return
            step, t_ids = drafted
            pre = len(self.T.ids)
            accepted, record = yield from self.verify_meaning(step, t_ids, pre)
            if accepted or attempt == attempts:
                yield from self.settle(step, t_ids, pre, accepted, record, thrown=thrown)
                return
            # another draft of the same step: the target's cache back to before this one
            # (the draft re-syncs onto the target when it drafts)
            self.T.truncate(pre)
            thrown += len(step.tokens)

    def verify_meaning(self, step: DraftedStep, t_ids: list[int], pre: int
                       ) -> Generator[PassRequest, PassResult, tuple[bool, dict]]:
        """One target pass over the drafted step (appended after ``pre`` tokens); the probes'
        acceptance decision."""
        out = yield from self.T.forward(extra=t_ids, hidden=True, keep_for=self.follow_positions(pre, t_ids),
                                        phase="verify")
        skip = max(0, self.step_start - out.start)
        pooled_t = pool(out.hidden[skip:].unsqueeze(0))[0]
        return meaning_decision(self.probes, pooled_t, step.pooled, self.cfg, self.coin)


class StepJudgeSequence(DraftingSequence):
    """SpecReason-style: the target scores each drafted step 0-9 in one prefill pass."""

    method = "step_judge"

    def __init__(self, engine, messages, config, runners):
        super().__init__(engine, messages, config, runners)
        self.suffix_ids, digits = judge_prompt(engine.target.tokenizer)
        self.digit_ids = torch.tensor(digits, device=engine.target.device)

    def draft_out_of_room(self, extra: int = 0) -> bool:
        return super().draft_out_of_room(extra + len(self.suffix_ids))

    def speculate_step(self) -> Program:
        cfg = self.cfg
        drafted = yield from self.draft_for_target()
        if drafted is None:
            return
        step, t_ids = drafted
        pre = len(self.T.ids)
        yield from self.T.forward(extra=t_ids + self.suffix_ids,
                                  keep_for=self.follow_positions(pre, t_ids) + [pre + len(t_ids)], phase="judge")
        accepted, record = judge_decision(self.T.next_logits[self.digit_ids], cfg.judge_threshold)
        self.T.truncate(pre + len(t_ids))  # drop the judging question, keep the step
        yield from self.settle(step, t_ids, pre, accepted, record)


class TokenSDSequence(DraftingSequence):
    """Standard speculative sampling: k draft tokens, one target pass, min(1, p/q) accept,
    residual resampling; greedy is exact matching. Same tokenizer only."""

    method = "token_sd"

    def __init__(self, engine, messages, config, runners):
        if engine.draft is not None and not engine.same_tokenizer:
            raise MethodUnavailable(
                "token_sd needs a draft with the target's tokenizer; this pair has different "
                "tokenizers (use semspec or step_judge, which pass steps as text)"
            )
        super().__init__(engine, messages, config, runners)
        if config.draft_tokens < 1:
            raise ValueError("draft_tokens must be at least 1")

    def close_open_step(self) -> None:
        self.scan_steps("target", "token_verified", final=True)

    def advance(self) -> Program:
        cfg, c = self.cfg, self.counters
        rem = self.remaining()
        if rem <= 0:
            return self.finish("length")
        k = min(cfg.draft_tokens, rem - 1)
        if cfg.draft_max_batch and self.in_flight() > cfg.draft_max_batch:
            k = 0  # the batch's target pass runs anyway: drafting would only add head passes
        greedy = cfg.temperature <= 0
        drafted: list[int] = []
        qs: list[torch.Tensor | None] = []
        if k > 0:
            self.sync_draft(len(self.T.ids))
            for _ in range(k):
                lg = yield from self.D.logits(phase="draft")
                q = None if greedy else probs_from_logits(lg, cfg.temperature, cfg.top_p)
                x = int(lg.argmax()) if greedy else sample(q, self.rng_d)
                drafted.append(x)
                qs.append(q)
                self.D.append([x])
                if x in self.eos:
                    break
                if cfg.draft_stop_prob > 0:  # unsure of this token: the next would rarely be kept
                    p_x = float(torch.softmax(lg.float(), -1)[x]) if greedy else float(q[x])
                    if p_x < cfg.draft_stop_prob:
                        break
        pre = len(self.T.ids)
        if drafted:
            yield from self.T.forward(extra=drafted, phase="verify")
            last = None
        else:
            last = yield from self.T.logits(phase="verify")
        n_acc = 0
        new = None
        for i, x in enumerate(drafted):
            lg = self.T.logits_before(pre + i)
            if greedy:
                ok = int(lg.argmax()) == x
            else:
                p = probs_from_logits(lg, cfg.temperature, cfg.top_p)
                q = qs[i]
                qx = float(q[x]) if x < q.shape[0] else 0.0
                px = float(p[x]) if x < p.shape[0] else 0.0
                ok = qx > 0 and uniform(self.coin) < min(1.0, px / qx)
            if not ok:
                if greedy:
                    new = int(lg.argmax())
                else:
                    qq = torch.zeros_like(p)
                    n = min(p.shape[0], q.shape[0])
                    qq[:n] = q[:n].to(p.device)
                    resid = (p - qq).clamp_min(0)
                    new = sample(resid / resid.sum() if resid.sum() > 0 else p, self.rng)
                break
            n_acc += 1
        if new is None:
            lg = self.T.logits_before(pre + n_acc) if last is None else last
            new = sample_logits(lg, cfg.temperature, cfg.top_p, self.rng)
        self.T.truncate(pre + n_acc)
        c.drafted_tokens += len(drafted)
        self._step_drafted += len(drafted)
        # an accepted EOS ends the sequence there
        for j in range(pre, pre + n_acc):
            if self.T.ids[j] in self.eos:
                n_acc = j - pre
                self.T.truncate(j)
                new = None
                self.finish("eos")
                break
        c.accepted_tokens += n_acc
        self._step_accepted += n_acc
        if new is not None:
            self.take_target_token(new)
        if self.remaining() <= 0:
            self.finish("length")
        self.scan_steps("target", "token_verified")


METHOD_CLASSES = {
    "ar": ARSequence,
    "token_sd": TokenSDSequence,
    "step_judge": StepJudgeSequence,
    "semspec": SemSpecSequence,
}

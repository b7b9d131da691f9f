"""Continuous batching: many sequences in flight, each model run once per tick over all of them.

Every active sequence is a generator (``Sequence.program``) that yields the pass it needs
next. A tick runs the draft once over every sequence waiting on the draft, then the target
once over every sequence waiting on the target: decodes of sequences the target is writing,
drafted steps being verified, prefills of newly admitted prompts. Verifications wait (a
bounded number of ticks) while other sequences are still drafting, so that one target
pass checks many steps. Prefills are capped per
tick (``max_prefill_tokens``; a longer prompt is fed in chunks over several ticks) so a long
prompt never stalls the decodes. Draws from the pass's last rows are batched (one argmax or
one inverse-CDF draw per group of rows, each row with its own generator). A finished
sequence frees its slots at once, and the next waiting prompt takes them in the same tick.

Prompts that begin alike (the samples of one input, a shared system prompt) are prefilled
once: a new sequence copies the keys and values of the longest common prefix another
sequence has cached (at least ``MIN_SHARED_PREFIX`` tokens) and feeds only the rest. A
prompt whose twin is still being prefilled waits for it (a tick or a few) instead of
computing the same prefix beside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from .intake import Intake
from .runner import Feed, ModelRunner
from .sampling import sample_rows
from .stream import PassRequest, PassResult
from .types import Abort, Cancelled, Finished, GenerationConfig, Request

DEFAULT_MAX_PREFILL_TOKENS = 512
DEFAULT_MAX_VERIFY_WAIT = 32  # ticks; about one drafted step of the shipped probes' rule
DEFERRABLE_PHASES = ("verify", "judge")
# tokens; a shorter common prefix is cheaper to feed than to look for and copy
MIN_SHARED_PREFIX = 16


@dataclass
class PassStats:
    """Raw counts of the passes a scheduler ran, per model: passes, wall seconds, rows (one
    per sequence fed) and tokens fed, and rows and tokens per phase. Where the time goes
    when many sequences share passes; ratios are derived where they are reported."""

    target: dict[str, float] = field(default_factory=dict)
    draft: dict[str, float] = field(default_factory=dict)

    def add(self, is_target: bool, rows: list[tuple[str, int]], seconds: float) -> None:
        d = self.target if is_target else self.draft
        for key, value in (("passes", 1), ("seconds", seconds), ("rows", len(rows)),
                           ("tokens", sum(n for _, n in rows))):
            d[key] = d.get(key, 0) + value
        for phase, n in rows:
            d[f"{phase}_rows"] = d.get(f"{phase}_rows", 0) + 1
            d[f"{phase}_tokens"] = d.get(f"{phase}_tokens", 0) + n

    def add_shared(self, is_target: bool, tokens: int) -> None:
        """Prompt tokens copied from another sequence's cache instead of being fed."""
        d = self.target if is_target else self.draft
        d["shared_prefix_tokens"] = d.get("shared_prefix_tokens", 0) + tokens


@dataclass
class Runners:
    target: ModelRunner
    draft: ModelRunner | None


@dataclass
class _Active:
    key: Any
    seq: Any
    program: Any
    request: PassRequest | None = None
    since: int = 0  # the tick its request was made
    chunk_states: list = field(default_factory=list)  # states of a chunked prefill's earlier chunks


def _take_chunk(feed: Feed, n: int) -> Feed:
    """The first ``n`` tokens of ``feed`` as a feed of their own (no logits: those come with
    the last chunk); ``feed`` keeps the rest."""
    head = Feed(feed.slot, feed.tokens[:n], states=feed.states,
                head_inputs=feed.head_inputs[:n] if feed.head_inputs is not None else None)
    feed.tokens = feed.tokens[n:]
    feed.logit_rows = [r - n for r in feed.logit_rows if r >= n]
    if feed.head_inputs is not None:
        feed.head_inputs = feed.head_inputs[n:]
    return head


class Scheduler:
    def __init__(self, engine, batch_size: int, max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
                 max_verify_wait: int = DEFAULT_MAX_VERIFY_WAIT, stats: PassStats | None = None,
                 share_prefixes: bool = True):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.engine = engine
        self.batch_size = batch_size
        self.max_prefill_tokens = max(1, max_prefill_tokens)
        self.max_verify_wait = max_verify_wait
        # off: every prompt is prefilled in full (what sharing saves is measured against it)
        self.min_shared_prefix = MIN_SHARED_PREFIX if share_prefixes else None
        t_tap = d_tap = None
        if engine.probes is not None:
            t_tap = engine.probes.target.resolved_layer(engine.target.num_layers)
            d_tap = engine.probes.draft.resolved_layer(engine.draft.num_layers)
        self.runners = Runners(
            ModelRunner(engine.target, batch_size, tap_layer=t_tap),
            ModelRunner(engine.draft, batch_size, tap_layer=d_tap) if engine.draft is not None else None,
        )
        self.ticks = 0
        self.in_flight = 0  # sequences admitted and not finished (Sequence.in_flight reads it)
        self.stats = stats if stats is not None else PassStats()

    def run(self, requests: Iterable[Request], default: GenerationConfig) -> Iterator[Finished]:
        """Decode every request, yielding each as it finishes. ``requests`` is read lazily:
        the next one is taken only when a slot is free. A source fed while decoding (a
        worker's) may yield None for "nothing ready yet": the tick goes on with the active
        sequences and asks again next tick; with none active it should block instead. An
        :class:`Abort` from the source ends that request at once (``semspec.intake``)."""
        intake = Intake(requests)
        active: list[_Active] = []
        held: list[_Active] = []  # admitted, waiting for a twin's prefill to copy it
        while True:
            for entry in list(held):
                if not self._waits_for_prefix(entry, active):
                    held.remove(entry)
                    yield from self._start(entry, active)
            # None: the source has nothing ready now: decode what is active
            while (req := intake.next(room=len(active) + len(held) < self.batch_size)) is not None:
                if isinstance(req, Abort):
                    yield from self._abort(req.key, active, held)
                    continue
                entry, finished = self._admit(req, default)
                if finished is not None:
                    yield finished
                elif self._waits_for_prefix(entry, active):
                    held.append(entry)
                else:
                    yield from self._start(entry, active)
            self.in_flight = len(active) + len(held)
            if not active:
                if held:  # their twins are gone: they prefill themselves
                    for entry in held:
                        yield from self._start(entry, active)
                    held = []
                    continue
                if intake.exhausted:
                    return
                continue  # a live source had nothing ready (or only aborts): ask it again
            self.ticks += 1
            done: list[Finished] = []
            drafting = [a for a in active if self._wants(a, self.runners.draft)]
            if drafting:
                done.extend(self._run_pass(self.runners.draft, drafting))
            waiting = [a for a in active if self._wants(a, self.runners.target)]
            if waiting and self._target_due(waiting, any(self._wants(a, self.runners.draft) for a in active)):
                done.extend(self._run_pass(self.runners.target, waiting))
            active = [a for a in active if a.request is not None]
            yield from done

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _wants(a: _Active, runner: ModelRunner | None) -> bool:
        return runner is not None and a.request is not None and a.request.stream.runner is runner

    def _target_due(self, waiting: list[_Active], drafting: bool) -> bool:
        """Whether the target runs this tick. Verifications can wait while other sequences
        are still drafting their steps: one target pass then checks many steps at once
        instead of one pass per tick for whichever step happens to be ready (a pass over
        many rows costs little more than over one). Writes and prefills never wait, and a
        verification waits at most ``max_verify_wait`` ticks. ``drafting``: whether any
        sequence will draft next tick."""
        if not drafting:
            return True
        for a in waiting:
            if a.request.phase not in DEFERRABLE_PHASES or self.ticks - a.since >= self.max_verify_wait:
                return True
        return False

    def _admit(self, req: Request, default: GenerationConfig) -> tuple[_Active | None, Finished | None]:
        try:
            seq = self.engine.new_sequence(req.prompt, req.config or default, self.runners)
        except Exception as e:  # a bad prompt fails that item alone
            return None, Finished(req.key, None, e)
        for stream in seq.streams:
            stream.slot = stream.runner.alloc()
        seq.in_flight = lambda: self.in_flight
        return _Active(req.key, seq, seq.program()), None

    def _start(self, entry: _Active, active: list[_Active]) -> Iterator[Finished]:
        """Copy what the active sequences have cached of this one's prompt, then run it up
        to its first pass."""
        for stream in entry.seq.streams:
            donor, n = self._best_donor(stream, active)
            if donor is not None and n >= self.min_shared_prefix:
                stream.adopt_prefix(donor, n)
                self.stats.add_shared(stream.runner is self.runners.target, n)
        finished = self._send(entry, None)
        if finished is not None:
            yield finished
        else:
            active.append(entry)

    def _donors(self, stream, active: list[_Active]):
        if self.min_shared_prefix is None or not stream.shares_prefix or stream.cached:
            return
        for a in active:
            for d in a.seq.streams:
                if d.runner is stream.runner and d.shares_prefix and d.slot is not None:
                    yield a, d

    def _best_donor(self, stream, active: list[_Active]):
        best, best_n = None, 0
        for _, d in self._donors(stream, active):
            n = stream.shareable_from(d)[0]
            if n > best_n:
                best, best_n = d, n
        return best, best_n

    def _waits_for_prefix(self, entry: _Active, active: list[_Active]) -> bool:
        """Whether a stream of ``entry`` would copy a longer prefix once a sequence that is
        prefilling now has cached it."""
        for stream in entry.seq.streams:
            shares = [(a, d, *stream.shareable_from(d)) for a, d in self._donors(stream, active)]
            have = max((now for _, _, now, _ in shares), default=0)
            for a, d, _, later in shares:
                prefilling = a.request is not None and a.request.stream is d and a.request.phase == "prefill"
                if prefilling and later >= self.min_shared_prefix and later > have:
                    return True
        return False

    def _send(self, entry: _Active, value, error: Exception | None = None) -> Finished | None:
        """Resume a sequence with a pass result (or an error); returns its outcome if it ended."""
        try:
            entry.request = entry.program.throw(error) if error is not None else entry.program.send(value)
            entry.since = self.ticks
            return None
        except StopIteration:
            return self._retire(entry, None)
        except Exception as e:  # the sequence failed: that item alone
            return self._retire(entry, e)

    def _abort(self, key: Any, active: list[_Active], held: list[_Active]) -> Iterator[Finished]:
        """End the sequence of ``key`` between ticks, its slots freed (none: it has finished)."""
        for entries in (active, held):
            for entry in entries:
                if entry.key == key:
                    entries.remove(entry)
                    yield self._retire(entry, Cancelled(f"request {key!r} aborted"))
                    return

    def _retire(self, entry: _Active, error: Exception | None) -> Finished:
        entry.request = None
        self.in_flight -= 1  # at once: the others of this tick see the batch thinner
        for stream in entry.seq.streams:
            if stream.slot is not None:
                stream.runner.free(stream.slot)
                stream.slot = None
        if error is not None:
            return Finished(entry.key, None, error)
        return Finished(entry.key, entry.seq.result())

    def _run_pass(self, runner: ModelRunner, waiting: list[_Active]) -> list[Finished]:
        out: list[Finished] = []
        budget = self.max_prefill_tokens
        batch: list[tuple[_Active, Feed, bool]] = []  # entry, what it feeds now, whether complete
        # decodes and verifications first, then prefills within the budget
        for a in sorted(waiting, key=lambda a: a.request.phase == "prefill"):
            feed = a.request.feed
            overflow = runner.overflow(feed)
            if overflow is not None:  # that sequence fails, the pass goes on without it
                f = self._send(a, None, overflow)
                if f is not None:
                    out.append(f)
                continue
            if a.request.phase != "prefill":
                batch.append((a, feed, True))
                continue
            if budget <= 0:
                continue
            if len(feed.tokens) <= budget:
                batch.append((a, feed, True))
                budget -= len(feed.tokens)
            else:  # a chunk now, the rest in later ticks; no logits until the last chunk
                batch.append((a, _take_chunk(feed, budget), False))
                budget = 0
        if not batch:
            return out
        t = time.perf_counter()
        res = runner.forward([f for _, f, _ in batch])
        complete = [(i, a) for i, (a, _, whole) in enumerate(batch) if whole]
        sampled = [(i, a) for i, a in complete if a.request.sample is not None]
        tokens = {}
        if sampled:
            last = torch.stack([res.logits[res.row_start[i] + len(batch[i][1].logit_rows) - 1] for i, _ in sampled])
            for (i, _), tok in zip(sampled, sample_rows(last, [a.request.sample for _, a in sampled])):
                tokens[i] = tok
        seconds = time.perf_counter() - t
        self.stats.add(runner is self.runners.target, [(a.request.phase, len(f.tokens)) for a, f, _ in batch], seconds)
        for i, (a, _, whole) in enumerate(batch):
            a.seq.counters.add_time(a.request.phase, seconds)
            if not whole:  # the stream counts the pass that completes its request itself
                a.request.stream.forward_passes += 1
                if res.states[i] is not None:
                    a.chunk_states.append(res.states[i])
        for i, a in complete:
            feed = batch[i][1]
            n = len(feed.logit_rows)
            logits = res.logits[res.row_start[i]: res.row_start[i] + n] if n else None
            states = res.states[i]
            if a.chunk_states and states is not None:
                states, a.chunk_states = torch.cat(a.chunk_states + [states]), []
            f = self._send(a, PassResult(logits, res.hidden[i], tokens.get(i), states))
            if f is not None:
                out.append(f)
        return out

"""Continuous batching: many sequences in flight, each model run once per tick over all of them.

Every active sequence is a generator (``Sequence.program``) that yields the pass it needs
next. A tick runs the draft once over every sequence waiting on the draft, then the target
once over every sequence waiting on the target: decodes of sequences the target is writing,
drafted steps being verified, prefills of newly admitted prompts. Prefills are capped per
tick (``max_prefill_tokens``; a longer prompt is fed in chunks over several ticks) so a long
prompt never stalls the decodes. Draws from the pass's last rows are batched (one argmax or
one inverse-CDF draw per group of rows, each row with its own generator). A finished
sequence frees its slots at once, and the next waiting prompt takes them in the same tick.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch

from .runner import ContextOverflow, Feed, ModelRunner
from .sampling import sample_rows
from .stream import PassRequest, PassResult
from .types import Finished, GenerationConfig, Request

DEFAULT_MAX_PREFILL_TOKENS = 512


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


class Scheduler:
    def __init__(self, engine, batch_size: int, max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.engine = engine
        self.batch_size = batch_size
        self.max_prefill_tokens = max(1, max_prefill_tokens)
        t_tap = d_tap = None
        if engine.probes is not None:
            t_tap = engine.probes.target.resolved_layer(engine.target.num_layers)
            d_tap = engine.probes.draft.resolved_layer(engine.draft.num_layers)
        self.runners = Runners(
            ModelRunner(engine.target, batch_size, tap_layer=t_tap),
            ModelRunner(engine.draft, batch_size, tap_layer=d_tap) if engine.draft is not None else None,
        )
        self.ticks = 0

    def run(self, requests: Iterable[Request], default: GenerationConfig) -> Iterator[Finished]:
        """Decode every request, yielding each as it finishes. ``requests`` is read lazily:
        the next one is taken only when a slot is free. A source fed while decoding (a
        worker's) may yield None for "nothing ready yet": the tick goes on with the active
        sequences and asks again next tick; with none active it should block instead."""
        pending = iter(requests)
        active: list[_Active] = []
        exhausted = False
        while True:
            while not exhausted and len(active) < self.batch_size:
                try:
                    req = next(pending)
                except StopIteration:
                    exhausted = True
                    break
                if req is None:  # the source has nothing ready now: decode what is active
                    break
                entry, finished = self._admit(req, default)
                if finished is not None:
                    yield finished
                else:
                    active.append(entry)
            if not active:
                return
            self.ticks += 1
            done: list[Finished] = []
            for runner in (self.runners.draft, self.runners.target):
                if runner is None:
                    continue
                waiting = [a for a in active if a.request is not None and a.request.stream.runner is runner]
                if waiting:
                    done.extend(self._run_pass(runner, waiting))
            active = [a for a in active if a.request is not None]
            yield from done

    # ------------------------------------------------------------------ internals
    def _admit(self, req: Request, default: GenerationConfig) -> tuple[_Active | None, Finished | None]:
        try:
            seq = self.engine.new_sequence(req.prompt, req.config or default, self.runners)
        except Exception as e:  # a bad prompt fails that item alone
            return None, Finished(req.key, None, e)
        for stream in seq.streams:
            stream.slot = stream.runner.alloc()
        entry = _Active(req.key, seq, seq.program())
        return entry, self._send(entry, None)

    def _send(self, entry: _Active, value, error: Exception | None = None) -> Finished | None:
        """Resume a sequence with a pass result (or an error); returns its outcome if it ended."""
        try:
            entry.request = entry.program.throw(error) if error is not None else entry.program.send(value)
            return None
        except StopIteration:
            return self._retire(entry, None)
        except Exception as e:  # the sequence failed: that item alone
            return self._retire(entry, e)

    def _retire(self, entry: _Active, error: Exception | None) -> Finished:
        entry.request = None
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
            room = runner.max_context
            if room is not None and runner.lengths[feed.slot] + len(feed.tokens) > room:
                f = self._send(a, None, ContextOverflow(
                    f"sequence of {runner.lengths[feed.slot] + len(feed.tokens)} tokens exceeds "
                    f"the model's context of {room}"))
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
                batch.append((a, Feed(feed.slot, feed.tokens[:budget]), False))
                feed.tokens = feed.tokens[budget:]
                feed.logit_rows = [r - budget for r in feed.logit_rows if r >= budget]
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
        for a, _, whole in batch:
            a.seq.counters.add_time(a.request.phase, seconds)
            if not whole:  # the stream counts the pass that completes its request itself
                a.request.stream.forward_passes += 1
        for i, a in complete:
            feed = batch[i][1]
            n = len(feed.logit_rows)
            logits = res.logits[res.row_start[i]: res.row_start[i] + n] if n else None
            f = self._send(a, PassResult(logits, res.hidden[i], tokens.get(i)))
            if f is not None:
                out.append(f)
        return out

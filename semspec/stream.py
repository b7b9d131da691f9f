"""One model's view of one sequence: token ids, a runner slot holding their KV cache, and the
next-token logits.

Invariant: the slot caches ``ids[:cached]``; ``ids[cached:]`` are *pending* tokens (appended
but not yet run), fed with the next pass. ``next_logits`` are the logits after
``ids[:cached]`` and are only valid when nothing is pending. Rolling back (``truncate``) sets
the slot's length and restores the logits from the last pass when it covered that position,
so a rejection never costs an extra pass.

A stream never runs the model itself. ``forward`` is a generator: it yields one
:class:`PassRequest` and is sent back the :class:`PassResult` of the batched pass the
scheduler ran it in (``out = yield from stream.forward(...)``), so a method written as a
generator over its streams reads like straight-line code while every sequence's requests
share one pass per model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

import torch

from .runner import Feed, ModelRunner


@dataclass
class Sample:
    """Draw the next token from the pass's last row: greedy when ``temperature`` is 0."""

    temperature: float
    top_p: float
    generator: torch.Generator | None


@dataclass
class PassRequest:
    stream: "Stream"
    feed: Feed
    phase: str  # where the pass's time is booked in Counters.phase_seconds
    sample: Sample | None = None


@dataclass
class PassResult:
    logits: torch.Tensor | None  # [len(feed.logit_rows), V] float32
    hidden: torch.Tensor | None  # [n_fed, H] float32 tapped states
    token: int | None = None  # the drawn token, when the request asked for one
    states: torch.Tensor | None = None  # [n_fed, H] float32 final-norm states, when asked for


@dataclass
class ForwardOut:
    logits: torch.Tensor | None  # one row per entry of ``rows``; the last row predicts the next token
    hidden: torch.Tensor | None  # [n_fed, H] states of the runner's tap layer, or None
    start: int  # absolute position of the first fed token
    rows: list[int]  # fed-token offsets whose logits were computed
    token: int | None = None


Pass = Generator[PassRequest, PassResult, ForwardOut]


class Stream:
    def __init__(self, runner: ModelRunner, ids: list[int]):
        self.runner = runner
        self.lm = runner.lm
        self.ids: list[int] = list(ids)
        self.slot: int | None = None  # given by the scheduler when the sequence is admitted
        self.cached = 0
        self._tail_logits: torch.Tensor | None = None  # logits after ids[:cached]
        self.forward_passes = 0
        # position -> logits predicting it, from the last pass: restored on rollback
        self._rollback_logits: dict[int, torch.Tensor | None] = {}
        # the final-norm state of each cached position, kept when a draft head reads them
        self.keep_states = False
        self.states: dict[int, torch.Tensor] = {}

    # whether another stream's cached prompt prefix can be copied into this one (a head's
    # cache depends on the states it read, not only on its tokens)
    shares_prefix = True

    def __len__(self) -> int:
        return len(self.ids)

    def shareable_from(self, donor: "Stream") -> tuple[int, int]:
        """(positions of ``donor``'s cache this stream could take now, positions it could
        take once ``donor`` has cached the common prefix): tokens equal from the start, and
        at least the last token left to feed, whose logits this stream needs."""
        n = 0
        limit = min(len(donor.ids), len(self.ids) - 1)
        while n < limit and donor.ids[n] == self.ids[n]:
            n += 1
        now = min(n, donor.cached)
        if self.keep_states:  # the kept states come along; a pruned one ends the share
            now = next((p for p in range(now) if p not in donor.states), now)
        return now, n

    def adopt_prefix(self, donor: "Stream", length: int) -> None:
        """Start from ``donor``'s first ``length`` cached positions instead of feeding them."""
        if self.cached:
            raise RuntimeError("only a stream with nothing cached adopts a prefix")
        self.runner.copy_prefix(donor.slot, self.slot, length)
        self.cached = length
        if self.keep_states:
            self.states.update({p: donor.states[p] for p in range(length)})

    @property
    def pending(self) -> list[int]:
        return self.ids[self.cached:]

    @property
    def next_logits(self) -> torch.Tensor | None:
        return self._tail_logits if self.cached == len(self.ids) else None

    def append(self, tokens) -> None:
        self.ids.extend(int(t) for t in tokens)

    def forward(self, extra=(), hidden: bool = False, keep_for: list[int] | None = None,
                phase: str = "target_write", sample: Sample | None = None) -> Pass:
        """Run pending tokens + ``extra`` (appended to ``ids``) in one pass.

        ``keep_for``: absolute positions whose predicting logits the caller will need (to
        verify or to roll back to); the LM head runs only for those rows and the last one.
        None keeps every row. ``hidden``: return the tap layer's states of the fed tokens.
        ``sample``: also draw the next token from the last row (batched with the pass's
        other draws)."""
        self.append(extra)
        if self.cached == len(self.ids):
            raise RuntimeError("nothing to feed")
        return (yield from self._run(len(self.ids), hidden, keep_for, phase, sample))

    def _run(self, end: int, hidden: bool, keep_for: list[int] | None, phase: str, sample: Sample | None) -> Pass:
        """One pass feeding ``ids[cached:end]``."""
        feed = self.ids[self.cached:end]
        start = self.cached
        if keep_for is None:
            rows = list(range(len(feed)))
        else:
            # row r holds the logits predicting position start + r + 1
            rows = sorted({p - 1 - start for p in keep_for if 0 <= p - 1 - start < len(feed)} | {len(feed) - 1})
        res = yield PassRequest(self, self._feed(start, list(feed), rows, hidden), phase, sample)
        self.forward_passes += 1
        logits = res.logits
        # logits predicting each covered position, to restore on rollback (the position the
        # pass started at is predicted by the logits from before it)
        self._rollback_logits = {start: self._tail_logits}
        self._rollback_logits.update({start + r + 1: logits[i] for i, r in enumerate(rows)})
        self._record(start, res)
        self.cached = end
        self._tail_logits = logits[-1]
        return ForwardOut(logits, self._hidden_of(res), start, rows, res.token)

    def _feed(self, start: int, tokens: list[int], rows: list[int], hidden: bool) -> Feed:
        return Feed(self.slot, tokens, rows, tap=hidden, states=self.keep_states)

    def _record(self, start: int, res: PassResult) -> None:
        if self.keep_states and res.states is not None:
            # a copy: the pass's tensor holds every sequence's rows, which must not stay alive
            self.states.update({start + i: row for i, row in enumerate(res.states.clone())})

    def _hidden_of(self, res: PassResult) -> torch.Tensor | None:
        return res.hidden

    def drop_states_before(self, position: int) -> None:
        """Forget the kept final-norm states of positions before ``position`` (no longer read)."""
        for p in [p for p in self.states if p < position]:
            del self.states[p]

    def logits(self, phase: str = "target_write") -> Generator[PassRequest, PassResult, torch.Tensor]:
        """Next-token logits after all ids, running a pass only if needed."""
        if self.next_logits is not None:
            return self.next_logits
        if self.cached == len(self.ids):  # logits lost (e.g. a re-fed attempt): re-run the last token
            self._set_cached(len(self.ids) - 1)
        yield from self.forward(phase=phase)
        return self.next_logits

    def next_token(self, sample: Sample, phase: str = "target_write") -> Generator[PassRequest, PassResult, int]:
        """The next token after all ids: drawn in the pass that feeds what is pending, or from
        the logits already at hand."""
        from .sampling import sample_rows

        if self.next_logits is not None:
            return sample_rows(self.next_logits[None], [sample])[0]
        if self.cached == len(self.ids):
            self._set_cached(len(self.ids) - 1)
        out = yield from self.forward(phase=phase, keep_for=[], sample=sample)
        return out.token

    def logits_before(self, position: int) -> torch.Tensor | None:
        """Logits predicting ``ids[position]`` if the last pass (or the state before it) has them."""
        return self._rollback_logits.get(position)

    def truncate(self, length: int) -> None:
        """Drop ``ids[length:]``, rolling the slot back to match."""
        if length < 0 or length > len(self.ids):
            raise ValueError(f"cannot truncate {len(self.ids)} ids to {length}")
        if length == len(self.ids):
            return
        if length > self.cached:  # only pending tokens go
            self.ids = self.ids[:length]
            return
        restored = self.logits_before(length)
        self.ids = self.ids[:length]
        self._set_cached(length)
        self._tail_logits = restored

    def refeed_from(self, position: int) -> None:
        """Drop the cache from ``position`` on, keeping the ids: the next pass runs them
        again (to get back states or logits that were not kept)."""
        if not 0 <= position <= self.cached:
            raise ValueError(f"cannot re-feed from {position}: {self.cached} tokens are cached")
        self._set_cached(position)

    def _set_cached(self, length: int) -> None:
        if length < self.cached:
            self._tail_logits = None
            if self.slot is not None:
                self.runner.set_length(self.slot, length)
            for p in [p for p in self.states if p >= length]:
                del self.states[p]
        self.cached = length

    @property
    def reusable(self) -> int:
        """How many leading ids a re-sync onto another stream may keep as they are."""
        return len(self.ids)


class HeadStream(Stream):
    """A draft head's view of a sequence (``semspec.head``): the head at position j reads the
    state at j-1 -- the target's, from the target stream's kept states, when the target has
    run that position with the same tokens, else the head's own prediction from an earlier
    pass. ``true_upto``: cached positions below it read the target's states; the ones after
    read predictions and are re-fed (``reusable``) once the target's states are known, so
    each new draft starts from the target's view."""

    shares_prefix = False

    def __init__(self, runner: ModelRunner, ids: list[int], target: Stream):
        super().__init__(runner, ids)
        self.target = target
        target.keep_states = True
        self.predicted: dict[int, torch.Tensor] = {}
        self.true_upto = 0
        self._zero = torch.zeros(runner.lm.hidden_size, device=runner.lm.device)

    def input_state(self, position: int) -> tuple[torch.Tensor | None, bool]:
        """(state the head reads after ``position``, whether it is the target's)."""
        if position < 0:
            return self._zero, True
        t = self.target
        row = t.states.get(position) if position < len(t.ids) and t.ids[position] == self.ids[position] else None
        if row is not None:
            return row, True
        return self.predicted.get(position), False

    @property
    def reusable(self) -> int:
        return self.true_upto if self.true_upto < self.cached else len(self.ids)

    def forward(self, extra=(), hidden: bool = False, keep_for: list[int] | None = None,
                phase: str = "draft", sample: Sample | None = None) -> Pass:
        """Run pending tokens + ``extra``. Every pass returns the head's predicted states
        (``hidden``). Tokens whose input state only this pass would predict are fed in
        further passes, one after another."""
        self.append(extra)
        if self.cached == len(self.ids):
            raise RuntimeError("nothing to feed")
        back = self.cached
        while back > 0 and self.input_state(back - 1)[0] is None:  # a prediction lost to a rollback
            back -= 1
        self._set_cached(back)
        first, states = self.cached, []
        while True:
            end = self.cached + 1
            while end < len(self.ids) and self.input_state(end - 1)[0] is not None:
                end += 1
            last = end == len(self.ids)
            # the first read of a prompt is a prefill: the scheduler caps and chunks it (and,
            # as for any prefill, only the last row's logits are wanted)
            prefill = self.cached == 0 and end > 1
            out = yield from self._run(end, True, keep_for if last and not prefill else [],
                                       "prefill" if prefill else phase, sample if last else None)
            states.append(out.hidden)
            if last:
                shift = out.start - first
                return ForwardOut(out.logits, torch.cat(states), first, [r + shift for r in out.rows], out.token)

    def _feed(self, start: int, tokens: list[int], rows: list[int], hidden: bool) -> Feed:
        inputs = [self.input_state(p - 1) for p in range(start, start + len(tokens))]
        if start == self.true_upto:
            n_true = 0
            while n_true < len(inputs) and inputs[n_true][1]:
                n_true += 1
            self._pending_true = start + n_true
        else:
            self._pending_true = self.true_upto
        return Feed(self.slot, tokens, rows, states=True, head_inputs=torch.stack([s for s, _ in inputs]))

    def _record(self, start: int, res: PassResult) -> None:
        self.predicted.update({start + i: row for i, row in enumerate(res.states.clone())})
        self.true_upto = self._pending_true

    def _hidden_of(self, res: PassResult) -> torch.Tensor | None:
        return res.states

    def drop_states_before(self, position: int) -> None:
        for p in [p for p in self.predicted if p < position]:
            del self.predicted[p]

    def _set_cached(self, length: int) -> None:
        if length < self.cached:
            for p in [p for p in self.predicted if p >= length]:
                del self.predicted[p]
            self.true_upto = min(self.true_upto, length)
        super()._set_cached(length)

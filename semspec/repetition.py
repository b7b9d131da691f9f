"""Loops stopped as they start: degenerate repetition at the tail of generated token ids.

Sampled small models often fall into a loop ("The answer is 64." thirty times, "#### 17\\nErin
has 17 lollipops." over and over) until the token cap. The rule (``LoopRule``): the generated ids
end with ``repeats`` copies of one unit of ``min_unit`` to ``max_unit`` tokens. A unit shorter
than ``min_unit`` counts as its multiples, so a loop always covers ``repeats * min_unit`` tokens
at least (a number's digits, "1, 2, 3" or a line said twice never do). It is vLLM's own
(``SamplingParams.repetition_detection``: ``vllm.v1.core.sched.utils.check_sequence_repetition``),
so an engine can have vLLM end a request at the very token the rule fires on, and read the
cut here (``find_loop``).

The cut keeps ONE copy of the repeated unit (the loop's fundamental period, its run followed
back as far as it goes) and cuts at the start of the second: an answer written before the loop,
or as its first copy, stays. Where the unit holds a line break, the kept copy is the one that
starts a line (``line_breaks``), so the answer line is whole.

Measured (the rule applied offline to every sample's ids) on the embedded SmolLM2-135M-Instruct,
64 GSM8K test questions (lines 301-364), n 4, T 0.6, top-p 0.95, 512 tokens: with the defaults
(3 copies of a unit of 18-64 tokens) 1 of 225 EOS-ending samples is cut (0.4%: a 50-token
sentence said three times, a wrong answer), and none of the 422 EOS-ending texts of the
benchmark results then kept in the tree; of the 31 samples at the cap, 12 end in an exact loop (a periodic tail of 64
tokens or more), 11 of them are cut, and 83% of their tail tokens (from the loop's onset to the
cap) are not generated; a loop is found 53 tokens after its onset on median (86 at most there;
(repeats - 1) * max_unit at worst). The other 19 repeat lines with changing numbers or ramble:
no exact loop, left alone. Looser rules cut more finished samples: 3 copies of 10+ tokens 1.8%,
2 copies of 24+ tokens 1.3%. Online (stop_loops) every sample of that job ended and was cut
where the rule says on its own ids.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class LoopRule:
    """A loop: the ids end with ``repeats`` copies of a unit of ``min_unit`` to ``max_unit``
    tokens (a shorter unit counts as its multiples: ``min_tokens`` at least)."""

    repeats: int = 3
    min_unit: int = 18
    max_unit: int = 64

    def __post_init__(self):
        if self.repeats < 2:
            raise ValueError("repeats must be at least 2")
        if not 1 <= self.min_unit <= self.max_unit:
            raise ValueError("units must be 1 <= min_unit <= max_unit tokens")

    @property
    def min_tokens(self) -> int:
        """The fewest tokens a loop covers."""
        return self.repeats * self.min_unit

    def vllm_params(self) -> dict[str, int]:
        """The rule as ``vllm.sampling_params.RepetitionDetectionParams``' arguments."""
        return {"max_pattern_size": self.max_unit, "min_pattern_size": self.min_unit, "min_count": self.repeats}


DEFAULT_RULE = LoopRule()


def vllm_detection(stop_loops: bool, rule: LoopRule = DEFAULT_RULE) -> dict:
    """``vllm.SamplingParams``' arguments that have vLLM end a request at the token ``rule``
    fires on; none without ``stop_loops``."""
    if not stop_loops:
        return {}
    from vllm.sampling_params import RepetitionDetectionParams

    return {"repetition_detection": RepetitionDetectionParams(**rule.vllm_params())}


def loop_unit(ids: Sequence[int], end: int, rule: LoopRule = DEFAULT_RULE) -> int | None:
    """The shortest unit (in ``rule``'s range) whose ``rule.repeats`` copies end ``ids[:end]``,
    else None. Only units ``q`` with ``ids[end-1] == ids[end-1-q]`` are looked at."""
    last = end - 1
    if end < rule.min_tokens:
        return None
    token = ids[last]
    copies = rule.repeats - 1
    for q in range(rule.min_unit, min(rule.max_unit, end // rule.repeats) + 1):
        if ids[last - q] != token:
            continue
        i = last - 1
        stop = end - q * copies
        while i >= stop and ids[i] == ids[i - q]:
            i -= 1
        if i < stop:
            return q
    return None


def loop_cut(ids: Sequence[int], end: int, unit: int, repeats: int,
             line_breaks: frozenset[int] | set[int] = frozenset()) -> int:
    """Where to cut ``ids[:end]``, which ends with ``repeats`` copies of a ``unit``-token unit:
    after one copy of the loop's fundamental unit, the first copy of its run (followed back as
    far as the ids repeat), or of its copies the first that starts a line (after a token of
    ``line_breaks``, or at the start), when one of its first tokens does."""
    span = unit * repeats
    period = next(p for p in range(1, unit + 1)
                  if unit % p == 0 and all(ids[i] == ids[i - p] for i in range(end - span + p, end)))
    start = end - span
    while start > 0 and ids[start - 1] == ids[start - 1 + period]:
        start -= 1
    first = next((j for j in range(start, start + period) if j == 0 or ids[j - 1] in line_breaks), start)
    return first + period


def find_loop(ids: Sequence[int], rule: LoopRule = DEFAULT_RULE, checked: int = 0,
              line_breaks: frozenset[int] | set[int] = frozenset()) -> int | None:
    """Where generated ``ids`` are cut (``loop_cut``) at the first prefix that ends in a loop,
    None when none does. ``checked``: a prefix already looked at (``ids[:checked]``'s prefixes
    held no loop), so a caller checks each new token once: ``find_loop(ids, rule, checked)``
    after every engine step."""
    for end in range(max(checked + 1, rule.min_tokens), len(ids) + 1):
        unit = loop_unit(ids, end, rule)
        if unit is not None:
            return loop_cut(ids, end, unit, rule.repeats, line_breaks)
    return None


def loop_end(ids: Sequence[int], rule: LoopRule = DEFAULT_RULE, checked: int = 0) -> int | None:
    """The length of the first prefix of ``ids`` (longer than ``checked``) that ends in a loop:
    where an engine that checks after every token stops."""
    return next((end for end in range(max(checked + 1, rule.min_tokens), len(ids) + 1)
                 if loop_unit(ids, end, rule) is not None), None)


_LINE_BREAKS: "weakref.WeakKeyDictionary[object, frozenset[int]]" = weakref.WeakKeyDictionary()


def line_break_ids(tokenizer) -> frozenset[int]:
    """The ids of ``tokenizer``'s tokens whose text holds a line break (read once per tokenizer)."""
    try:
        return _LINE_BREAKS[tokenizer]
    except (KeyError, TypeError):
        pass
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    found = frozenset(i for i, text in enumerate(texts) if "\n" in text)
    try:
        _LINE_BREAKS[tokenizer] = found
    except TypeError:  # not weakly referable: read again next time
        pass
    return found

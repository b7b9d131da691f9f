"""semspec.repetition: loops found at the tail of token ids, cut after their first copy."""

from __future__ import annotations

import random

import pytest

from semspec.repetition import DEFAULT_RULE, LoopRule, find_loop, line_break_ids, loop_end, loop_unit

NL = 1  # a line-break token
# "The answer is 64.\n" as ten token ids, and reasoning before it
ANSWER = [20, 21, 22, 23, 24, 25, 26, 27, 28, NL]
REASONING = list(range(100, 141))


def test_a_loop_after_an_answer_is_cut_after_its_first_copy():
    ids = REASONING + ANSWER * 30
    cut = find_loop(ids)
    assert cut == len(REASONING) + len(ANSWER)
    assert ids[:cut] == REASONING + ANSWER


def test_the_kept_copy_is_the_one_that_starts_a_line():
    """The text before the loop ends as its unit does ("so 64.\\n" before "The answer is
    64.\\n"): the run reaches back into it, and without line breaks the kept copy would end
    mid-line ("...so 64.\\nThe answer is"); with them it is the whole answer line."""
    before = list(range(100, 140)) + ANSWER[-4:]
    ids = before + ANSWER * 10
    assert find_loop(ids) == len(before) - 4 + len(ANSWER)
    assert find_loop(ids, line_breaks={NL}) == len(before) + len(ANSWER)


def test_a_loop_of_one_token_keeps_one():
    ids = REASONING + [7] * 100
    assert find_loop(ids) == len(REASONING) + 1


def test_a_loop_from_the_first_token_keeps_its_first_copy():
    assert find_loop(ANSWER * 8) == len(ANSWER)


def test_legitimate_repetition_is_not_a_loop():
    """A count (no unit repeats), a number's digits, a line said twice, a short unit said
    less than the rule's whole length: no loop."""
    count = [t for n in range(1, 60) for t in (*map(int, str(n)), 10, 11)]  # "1, 2, 3, ..."
    digits = [1] + [0] * (DEFAULT_RULE.min_tokens - 1)  # "1000000..."
    twice = REASONING + ANSWER * 2 + [50, 51, 52]
    short = REASONING + [64, 65] * (DEFAULT_RULE.min_tokens // 2 - 1)  # " 64 64 64 ..."
    for ids in (count, digits, twice, short):
        assert find_loop(ids) is None and loop_end(ids) is None
    assert find_loop(short + [64, 65]) == len(REASONING) + 2  # one pair more and it is


def test_it_fires_within_a_few_dozen_tokens_of_the_onset():
    """A loop is found as its ``repeats``-th copy ends: (repeats - 1) units after the cut, a
    unit shorter than ``min_unit`` counting as its shortest multiple that is not; never later
    than (repeats - 1) * max_unit tokens (or ``min_tokens``)."""
    rule = DEFAULT_RULE
    rng = random.Random(0)
    for unit_len in (1, 2, 3, 7, rule.min_unit, 17, 33, rule.max_unit):
        unit = [rng.randrange(1000, 2000) for _ in range(unit_len)]
        ids = REASONING + unit * (3 * rule.max_unit // unit_len + 3)
        end, cut = loop_end(ids), find_loop(ids)
        assert cut == len(REASONING) + unit_len
        assert end - cut <= max((rule.repeats - 1) * rule.max_unit, rule.min_tokens)
        counted = unit_len * -(-rule.min_unit // unit_len)  # the unit's shortest multiple in the rule's range
        assert end - cut == rule.repeats * counted - unit_len


def test_a_unit_longer_than_max_unit_is_not_a_loop():
    unit = list(range(1000, 1000 + DEFAULT_RULE.max_unit + 1))
    assert find_loop(REASONING + unit * 5) is None


def test_checking_as_tokens_come_finds_the_same_cut_as_checking_once():
    """``checked``: each engine step looks only at its new tokens, whatever their number, and
    finds the first prefix that loops as a look at the whole does."""
    rng = random.Random(1)
    for trial in range(200):
        unit = [rng.randrange(4) for _ in range(rng.randrange(1, 20))]
        ids = [rng.randrange(6) for _ in range(rng.randrange(0, 80))] + unit * rng.randrange(1, 12)
        ids += [rng.randrange(6) for _ in range(rng.randrange(0, 20))]
        rule = LoopRule(rng.randrange(2, 5), rng.randrange(1, 6), rng.randrange(6, 24))
        whole = find_loop(ids, rule)
        checked, found = 0, None
        while checked < len(ids) and found is None:
            step = checked + rng.randrange(1, 6)
            found = find_loop(ids[:step], rule, checked)
            checked = min(step, len(ids))
        assert found == whole, (trial, ids, rule)


def test_it_is_vllms_own_repetition_detection():
    """The rule fires on exactly the prefixes vLLM's repetition detection ends a request on,
    with the parameters ``vllm_params`` gives it: an engine lets vLLM stop the request."""
    from tests.conftest import require_vllm

    require_vllm()
    from vllm.sampling_params import RepetitionDetectionParams
    from vllm.v1.core.sched.utils import check_sequence_repetition

    rng = random.Random(2)
    fired = 0
    for rule in (DEFAULT_RULE, LoopRule(2, 1, 8), LoopRule(3, 3, 12), LoopRule(4, 2, 5)):
        params = RepetitionDetectionParams(**rule.vllm_params())
        for _ in range(150):
            unit = [rng.randrange(3) for _ in range(rng.randrange(1, 2 * rule.max_unit))]
            ids = [rng.randrange(3) for _ in range(rng.randrange(0, 40))] + unit * rng.randrange(1, 6)
            for end in range(1, len(ids) + 1):
                ours = loop_unit(ids, end, rule) is not None
                assert ours == check_sequence_repetition(ids[:end], params), (rule, ids[:end])
                fired += ours
    assert fired > 100


def test_rules_that_would_cut_anything_are_refused():
    with pytest.raises(ValueError):
        LoopRule(repeats=1)
    with pytest.raises(ValueError):
        LoopRule(min_unit=0)
    with pytest.raises(ValueError):
        LoopRule(min_unit=9, max_unit=8)
    assert LoopRule(3, 10, 64).vllm_params() == {"max_pattern_size": 64, "min_pattern_size": 10, "min_count": 3}


class _Tokenizer:
    def __init__(self, texts):
        self.texts = texts
        self.calls = 0

    def __len__(self):
        return len(self.texts)

    def batch_decode(self, seqs):
        self.calls += 1
        return [self.texts[s[0]] for s in seqs]


def test_line_breaks_are_the_tokens_whose_text_holds_one():
    tok = _Tokenizer(["a", "\n", ".\n\n", " b", "\r\n  "])
    assert line_break_ids(tok) == {1, 2, 4}
    assert line_break_ids(tok) == {1, 2, 4} and tok.calls == 1  # read once

"""Numbers stated in a reasoning step, for the judge's numeric-consistency rule.

Embedding similarity barely notices that "9 eggs for $2 make $18" and "7 eggs for $2 make
$14" say different things, so the judge also compares the numbers each step states.
`extract_numbers` reads digits ("18", "$18", "1,000", "3.5", "50%", "2.5 million") and
numbers written as words ("nine", "twenty-five", "two hundred and forty", "two dozen",
"twice", "half"), and returns their values in order of appearance.

Choices made here (all in one place so they can be revised together):
- A slash is division: "16/4" states 16 and 4 (GSM8K steps write "16/4 = 4"), and the word
  "half" states 2, "a third" 3, "a quarter" 4 -- so "half of 10 is 5" and "10/2 = 5" agree.
- "twice"/"double" state 2, "triple"/"thrice" 3; "N dozen" is N*12, a bare "dozen" is 12.
- Currency signs and unit words are dropped: "$18", "18 dollars" and "18" agree. A percent
  is a fraction: "60%", "60 percent" and "0.6" all state 0.6. A clock time "3:30" is 3.5.
- `numbers_consistent` compares the *sets* of stated values, ignoring the value 1 (which
  steps state or leave implicit at will: "each", "a", "one of them").
  mode="equal": the sets must be equal.
  mode="subset" (default): equal sets, or one step states a subset of the other's numbers
  and both end on the same number -- a step may spell out operands the other leaves
  implicit ("2 * 12 = 24 eggs" vs "24 eggs in two dozen"), but both must land on the same
  result. Anything else (a changed operand or result) makes the steps not equivalent,
  whatever their wording.
"""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19,
}
_TENS = {
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
    "eighty": 80, "ninety": 90,
}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
# Words that state a number on their own (operations and simple fractions).
_STANDALONE = {
    "twice": 2, "double": 2, "doubled": 2, "doubles": 2, "doubling": 2,
    "triple": 3, "tripled": 3, "triples": 3, "tripling": 3, "thrice": 3,
    "quadruple": 4, "quadrupled": 4,
    "half": 2, "halves": 2, "halved": 2, "halve": 2,
    "third": 3, "thirds": 3, "quarter": 4, "quarters": 4, "fourths": 4, "fifths": 5,
    "sixths": 6, "eighths": 8, "tenths": 10,
}
_IGNORED_IN_COMPARISON = {Fraction(1)}

# A number written with digits: optional thousands separators, optional decimals.
_DIGITS = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
_TOKEN_RE = re.compile(
    rf"(?P<clock>\b\d{{1,2}}:\d{{2}}\b)|(?P<num>{_DIGITS})(?P<pct>\s*%)?|(?P<word>[A-Za-z]+)"
)


def _parse_digits(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def extract_numbers(text: str) -> list[Fraction]:
    """All numbers stated in `text`, as exact fractions, in order of appearance."""
    out: list[Fraction] = []
    # Pending number-word phrase: total (completed scale groups) + current group.
    total = Fraction(0)
    current = Fraction(0)
    in_words = False  # inside a run of number words
    last_value_index: int | None = None  # index in `out` of the last emitted number
    prev_was_number = False  # the previous token closed a number (digits or words)

    def flush() -> None:
        nonlocal total, current, in_words, last_value_index
        if in_words:
            out.append(total + current)
            last_value_index = len(out) - 1
        total, current, in_words = Fraction(0), Fraction(0), False

    tokens = list(_TOKEN_RE.finditer(text))
    for i, m in enumerate(tokens):
        # A gap other than spaces/hyphens ends a word-number run ("nine, two" is two numbers).
        if in_words and i > 0:
            gap = text[tokens[i - 1].end() : m.start()]
            if gap.strip(" -") != "":
                flush()
        if m.group("clock") is not None:
            flush()
            hours, minutes = m.group("clock").split(":")
            out.append(Fraction(int(hours)) + Fraction(int(minutes), 60))
            last_value_index = len(out) - 1
            prev_was_number = True
            continue
        if m.group("num") is not None:
            flush()
            value = _parse_digits(m.group("num"))
            out.append(value / 100 if m.group("pct") else value)
            last_value_index = len(out) - 1
            prev_was_number = True
            continue
        word = m.group("word").lower()
        if word in _UNITS:
            if in_words and current % 100 >= 20 and current % 10 == 0 and _UNITS[word] < 10:
                current += _UNITS[word]  # "twenty five"
            elif in_words and current % 100 != 0:
                flush()  # "three four" are two numbers
                current, in_words = Fraction(_UNITS[word]), True
            else:
                current += _UNITS[word]
                in_words = True
            continue
        if word in _TENS:
            if in_words and current % 100 != 0:
                flush()
                in_words = True
            current += _TENS[word]
            in_words = True
            continue
        if word in _SCALES:
            scale = _SCALES[word]
            if in_words:
                if scale == 100:
                    current = (current or 1) * 100
                else:
                    total += (current or 1) * scale
                    current = Fraction(0)
                continue
            if prev_was_number and last_value_index is not None:
                out[last_value_index] *= scale  # "2.5 million", "3 hundred"
                continue
            if i > 0 and tokens[i - 1].group("word") and tokens[i - 1].group("word").lower() == "a":
                out.append(Fraction(scale))  # "a hundred"
                last_value_index = len(out) - 1
                prev_was_number = True
                continue
            prev_was_number = False
            continue
        if word == "and" and in_words:
            # "two hundred and forty": keep the run open only if a number word follows.
            nxt = tokens[i + 1].group("word").lower() if i + 1 < len(tokens) and tokens[i + 1].group("word") else ""
            if nxt in _UNITS or nxt in _TENS:
                continue
            flush()
            prev_was_number = False
            continue
        if word == "percent":
            was_words = in_words
            flush()
            if (was_words or prev_was_number) and last_value_index is not None:
                out[last_value_index] /= 100  # "50 percent", "fifty percent"
            prev_was_number = False
            continue
        if word in ("dozen", "dozens"):
            was_words = in_words
            flush()
            if (was_words or prev_was_number) and last_value_index is not None:
                out[last_value_index] *= 12  # "two dozen", "3 dozen"
            else:
                out.append(Fraction(12))
                last_value_index = len(out) - 1
            prev_was_number = True
            continue
        flush()
        if word in _STANDALONE:
            out.append(Fraction(_STANDALONE[word]))
            last_value_index = len(out) - 1
            prev_was_number = True
            continue
        # Any other word ("dollars", "eggs") ends the number: "3 eggs dozen" is not 36.
        prev_was_number = False
    flush()
    return out


def stated_values(text: str) -> frozenset[Fraction]:
    """The set of values a step states, minus values steps leave implicit at will (1)."""
    return frozenset(v for v in extract_numbers(text) if v not in _IGNORED_IN_COMPARISON)


def _last_value(numbers: list[Fraction]) -> Fraction | None:
    kept = [v for v in numbers if v not in _IGNORED_IN_COMPARISON]
    return kept[-1] if kept else None


def numbers_consistent(a: str, b: str, mode: str = "subset") -> bool:
    """True when the two steps' numbers do not contradict (see the module notes)."""
    na, nb = extract_numbers(a), extract_numbers(b)
    sa = frozenset(v for v in na if v not in _IGNORED_IN_COMPARISON)
    sb = frozenset(v for v in nb if v not in _IGNORED_IN_COMPARISON)
    if sa == sb:
        return True
    if mode == "equal":
        return False
    if mode != "subset":
        raise ValueError(f"unknown numbers mode {mode!r}; choose 'subset' or 'equal'")
    if not sa or not sb:
        return False  # one states numbers, the other none: different content
    if not (sa <= sb or sb <= sa):
        return False
    return _last_value(na) == _last_value(nb)

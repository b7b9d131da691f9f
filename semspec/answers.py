"""Final answers: finding one in a generated text, splitting reasoning from content, and
checking an answer against a reference. Pure functions, no I/O; the check alone runs
math-verify in a helper process, under a time limit (:mod:`semspec.answer_check_process`).

The engine's result (``GenerationResult.final_answer``), the job service and the bench all
use :func:`final_answer` and :func:`is_correct`, so they agree on what a model answered and
whether it was right.

Where the answer is looked for, in this order (the first rule that finds one wins):

1. the last ``\\boxed{...}`` (nested braces kept);
2. the last ``#### N`` (GSM8K's own format, which small models imitate);
3. the last "the answer is N" / "answer: N";
4. the last concluding sentence ("Therefore, Janet makes 624 dollars per day.", "So, the
   total cost is $1,250.") that holds a number: its last number;
5. a text that is nothing but a number;
6. :func:`final_answer` only: the last number anywhere (a guess, but better than nothing
   for traces cut off by the token budget).

With an end-of-thinking marker in the text, only the text after it is searched.
"""

from __future__ import annotations

import functools
import logging
import re
from fractions import Fraction

from .answer_check_process import CheckProcess, CheckTimedOut

log = logging.getLogger(__name__)

# A number as models write it: "-3", "$1,250.50", "\$5", "€12", "25%", "3/4", "\frac{3}{4}".
_NUMBER = (
    r"(?:(?<![\w)\]}])-)?"  # a sign, but not the minus between two operands ("16-3")
    r"(?:\\?\$|[€£])?\s?"  # currency before the number
    r"(?:\\[dt]?frac\{-?\d+\}\{\d+\}"  # a LaTeX fraction, kept whole for the checker
    r"|(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"  # 1,234 (thousands separators only in threes) or 1234
    r"(?:\.\d+)?(?:/\d+)?)"  # decimals ("18." ending a sentence is not one), a fraction 3/4
    r"(?:\\?%)?"  # a percentage keeps its number
)
_NUMBER_RE = re.compile(_NUMBER)

# Sentences that open with these words state what the trace concluded.
_CONCLUDING = re.compile(
    r"(?:therefore|so|thus|hence|in total|in all|altogether|overall|in conclusion|in summary|"
    r"finally|as a result|consequently)\b",
    re.IGNORECASE,
)


def normalize_answer(ans: str | None) -> str | None:
    """One spelling per answer, so that equal answers compare equal as strings: no currency,
    no thousands separators, no trailing zeros of decimals (18.0 -> 18), no percent sign, no
    units after a number ("624 dollars" -> 624). Anything else (an expression) is kept."""
    if ans is None:
        return None
    s = str(ans).strip().rstrip(".").strip()
    s = re.sub(r"\\\$|\$|€|£", "", s).strip()  # currency, and LaTeX's $...$ delimiters
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    m = re.fullmatch(r"(" + _NUMBER + r")\s*(?:\\text\{[^{}]*\}|[A-Za-z][A-Za-z ]*)?", s)
    if m:  # a number, perhaps with a unit after it
        s = m.group(1).replace(",", "").replace("\\%", "").replace("%", "").strip()
        if re.fullmatch(r"-?\d+\.\d+", s):
            s = s.rstrip("0").rstrip(".")
    return s or None


def _last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}``, braces inside it balanced."""
    i = text.rfind("\\boxed")
    j = text.find("{", i) if i != -1 else -1
    if j == -1:
        return None
    depth = 0
    for k in range(j, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1:k].strip() or None
    return None


def _after_hashes(text: str) -> str | None:
    found = re.findall(r"####\s*(" + _NUMBER + ")", text)
    return found[-1] if found else None


def _answer_is(text: str) -> str | None:
    """The number after the last "the answer is" / "answer:"; when an equation follows it in
    the sentence ("the answer is 2 * 4 = 8 bolts"), the number after its "=": small models
    state the computation, then its result."""
    found = re.findall(r"answer\s*(?:is\s*:?|:)\s*(" + _NUMBER + r")((?:[^\n.!?]|\.(?=\d))*)", text,
                       flags=re.IGNORECASE)
    if not found:
        return None
    stated, rest_of_sentence = found[-1]
    result = re.search(r"=\s*(" + _NUMBER + ")", rest_of_sentence)
    return result.group(1) if result else stated


def _sentences(text: str) -> list[str]:
    # a sentence ends at . ! ? followed by a space, or at a line break; "1,234.5" stays whole
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def _concluding_sentence(text: str) -> str | None:
    """The last number of the last sentence that opens with a concluding word and has one."""
    for sentence in reversed(_sentences(text)):
        opening = re.sub(r"^[\W_]+", "", sentence)  # markdown bullets, bold, quotes
        if _CONCLUDING.match(opening):
            numbers = _NUMBER_RE.findall(sentence)
            if numbers:
                return numbers[-1]
    return None


def _bare_number(text: str) -> str | None:
    m = re.fullmatch(r"\s*(" + _NUMBER + r")\.?\s*", text)
    return m.group(1) if m else None


def _last_number(text: str) -> str | None:
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


_RULES = (_last_boxed, _after_hashes, _answer_is, _concluding_sentence, _bare_number)


def _answer_part(text: str, think_end: str | None) -> str:
    """Where the answer is looked for: after the end-of-thinking marker when there is one."""
    if think_end and think_end in text:
        return text.rsplit(think_end, 1)[1]
    return text


def extract_answer(text: str, think_end: str | None = None) -> str | None:
    """The answer the text states (rules 1-5 of the module docstring), normalised; None
    when it states none."""
    part = _answer_part(text, think_end)
    for rule in _RULES:
        found = rule(part)
        if found is not None:
            return normalize_answer(found)
    return None


def final_answer(text: str, think_end: str | None = None) -> str | None:
    """The text's final answer: :func:`extract_answer`, else the last number in it."""
    found = extract_answer(text, think_end)
    if found is not None:
        return found
    return normalize_answer(_last_number(_answer_part(text, think_end)))


def split_reasoning(text: str, think_end: str | None = None) -> tuple[str, str]:
    """(reasoning, content). With the end-of-thinking marker in the text: what comes before
    its last occurrence and what comes after. Without one (models that do not think apart,
    like SmolLM2), the content is the trace's last non-empty line, where its answer is
    stated, and the reasoning is everything before it. Both stripped; together they hold
    all of the text but blank space and the marker."""
    if think_end and think_end in text:
        reasoning, content = text.rsplit(think_end, 1)
        return reasoning.strip(), content.strip()
    lines = text.strip().rsplit("\n", 1)
    if len(lines) == 1:
        return "", lines[0]
    return lines[0].strip(), lines[1].strip()


def reference_from(value: str | int | float | None) -> str | None:
    """The reference answer in an input field: a GSM8K answer text (a solution ending in
    ``#### N``) gives N; a plain string or number gives itself, normalised; None or an
    empty string gives None."""
    if value is None:
        return None
    text = str(value)
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip().split("\n", 1)[0]
    return normalize_answer(text)


# math-verify's own timeouts use signals, which work only in a process's main thread, and
# answers are checked in worker threads: so it runs in a helper process (answer_check_process),
# which is killed when a check runs past this limit; the answer is then compared as a number.
MATH_VERIFY_TIME_LIMIT_S = 5.0

# Still given to math-verify only: short answers, without powers of powers, huge exponents or
# factorials, which sympy would evaluate exactly for minutes. These would only run into the
# time limit (and cost a helper's restart), so they skip the round trip to it.
_MAX_VERIFY_CHARS = 100
_SLOW_TO_EVALUATE = re.compile(r"\^.*\^|\^\s*\{?\s*\d{6,}|!|\\binom")  # any factorial: (10!)! never ends

# The helper imports _parse_and_verify by name; it warms up on a check of its own, so that the
# imports (sympy, math-verify's LaTeX parser) are paid when it starts, not within a check's limit.
_checker = CheckProcess(f"{__name__}:_parse_and_verify", warm_up=("1", "1"))


@functools.cache
def _silence_timeout_warning() -> None:
    """math-verify warns once per process that its timeouts are off: here that is on purpose
    (the helper's caller enforces a time limit), and the warning would only puzzle whoever
    reads the log."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(lambda r: not r.getMessage().startswith("Timeout is disabled"))


def _math_verify(reference: str, answer: str) -> bool | None:
    """math-verify's verdict; None when it cannot parse a side as math, is not asked, or
    takes more than MATH_VERIFY_TIME_LIMIT_S."""
    if any(len(s) > _MAX_VERIFY_CHARS or _SLOW_TO_EVALUATE.search(s) for s in (reference, answer)):
        return None
    try:
        return _checker.call(reference, answer, timeout=MATH_VERIFY_TIME_LIMIT_S)
    except CheckTimedOut:
        log.warning("math-verify took over %s s on %r against %r: compared as numbers",
                    MATH_VERIFY_TIME_LIMIT_S, answer, reference)
        return None


def _parse_and_verify(reference: str, answer: str) -> bool | None:
    """math-verify itself, run in the helper process: its verdict, None when it cannot parse
    a side as math. Without its own timeouts: the helper's caller enforces the limit."""
    _silence_timeout_warning()
    # imported here: sympy and the LaTeX parser take a while to import, and only the helper
    # process needs them
    from math_verify import parse, verify
    from sympy import Basic

    # $...$ makes both sides LaTeX, so "\frac{3}{4}", "\sqrt{8}" and "2^{10}" parse too
    gold = parse(f"${reference}$", parsing_timeout=None)
    target = parse(f"${answer}$", parsing_timeout=None)
    if not any(isinstance(x, Basic) for x in gold) or not any(isinstance(x, Basic) for x in target):
        return None
    return verify(gold, target, timeout_seconds=None)  # the reference is math-verify's gold


def _as_fraction(s: str) -> Fraction | None:
    """A normalised number ("18", "-0.5", "3/4", "\\frac{3}{4}") as an exact fraction."""
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def is_correct(answer: str | None, reference: str | None) -> bool | None:
    """Whether ``answer`` is the ``reference`` answer: None without a reference, False when
    there is one but no answer was found (a trace cut off before it answered is wrong).

    Equal normalised strings are equal; otherwise math-verify decides (1/2 = 0.5 = \\frac{1}{2},
    2^{10} = 1024; decimals count as equal when they agree to 6 places, so 0.333 is not 1/3
    but 0.333333 is); when it cannot parse a side or takes more than
    MATH_VERIFY_TIME_LIMIT_S, the numbers are compared exactly. A
    percentage is its number: "25%" matches "25", not "0.25".
    """
    a, r = normalize_answer(answer), normalize_answer(reference)
    if r is None:
        return None
    if a is None:
        return False
    if a == r:
        return True
    try:
        verdict = _math_verify(r, a)
    except Exception:  # noqa: BLE001  (a checker failure must not lose the sample: compare numbers)
        verdict = None
    if verdict is not None:
        return verdict
    fa, fr = _as_fraction(a), _as_fraction(r)
    return fa is not None and fa == fr


def is_kept(correct: bool | None, final_answer: str | None, finish_reason: str) -> bool:
    """Whether a finished sample is one a dataset keeps: with a reference, a right answer
    (``correct``, from :func:`is_correct`; a loop cut after a right answer still counts);
    without one, a sample that ended by itself (EOS) with an answer found, so neither cut
    off at the token cap nor degenerate (finish reason "repetition"). A sample the doom rule
    stopped (finish reason "doomed") is never kept: its text breaks off where it was stopped."""
    if finish_reason == "doomed":
        return False
    if correct is not None:
        return correct
    return finish_reason == "eos" and final_answer is not None

"""Final answers: extraction from what models write, reasoning/content split, references and
the correctness check (math-verify with a numeric fallback). No models."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from semspec import answers
from semspec.answer_check_process import CheckProcess
from semspec.answers import (
    extract_answer,
    final_answer,
    is_correct,
    normalize_answer,
    reference_from,
    split_reasoning,
)

GSM8K_ANSWER = ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
                "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18")


@pytest.mark.parametrize("raw, want", [
    ("$1,234.", "1234"), (" 18.0 ", "18"), ("\\$5", "5"), ("0.50", "0.5"), (None, None), ("", None),
    ("x + 1", "x + 1"), ("€12", "12"), ("£3.5", "3.5"), ("25%", "25"), ("25\\%", "25"), ("-3", "-3"),
    ("624 dollars", "624"), ("18 \\text{ eggs}", "18"), ("3/4", "3/4"), ("\\dfrac{3}{4}", "\\frac{3}{4}"),
    ("$\\frac{1}{2}$", "\\frac{1}{2}"), ("1,234.50", "1234.5"),
])
def test_normalize_answer(raw, want):
    assert normalize_answer(raw) == want


@pytest.mark.parametrize("text, want", [
    # 1. \boxed{}, the last one, nested braces kept
    ("so \\boxed{1,234} done", "1234"),
    ("x \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("first \\boxed{3}, then $\\boxed{5}$", "5"),
    ("The final answer is $\\boxed{624 \\text{ dollars}}$.", "624"),
    # 2. #### N, ahead of "the answer is"
    ("blah\n#### 72", "72"),
    ("#### 5 then the answer is 7", "5"),
    ("#### $1,000", "1000"),
    # 3. the answer is N / answer: N
    ("The answer is $18.", "18"),
    ("So the answer is: -3.5", "-3.5"),
    ("Answer: 42", "42"),
    ("The answer is 2 * 4 = 8 bolts of blue fiber.", "8"),  # the result of the stated equation
    ("The answer is 2. Then 3 = 3.", "2"),  # an equation in a later sentence is not it
    # 4. the last concluding sentence with a number: its last number (SmolLM2 on GSM8K)
    ("She sells 9 eggs at $2.\n\nTherefore, Janet makes 624 dollars per day.", "624"),
    ("So, the total cost is $1,250.", "1250"),
    ("Thus, 25% of the class passed.", "25"),
    ("Hence the temperature is -3 degrees.", "-3"),
    ("In total, she spends €1,234.50 on food.", "1234.5"),
    ("So she has 3/4 of the pie left.", "3/4"),
    ("**Therefore**, x = \\frac{3}{4}.", "\\frac{3}{4}"),
    ("So, she makes 12 x 4 = 48 eggs.\nShe eats 3 of them.", "48"),
    ("So, 5 + 5 = 10.\n\nSo we are done.", "10"),  # the last concluding sentence *with* a number
    # 5. a text that is only a number
    ("18", "18"),
    (" 18.0 ", "18"),
    # no stated answer
    ("no number here", None),
    ("She has 16-3-4 = 9 eggs", None),  # a number, but stated nowhere: final_answer's fallback
    ("Solve 5 + 7 first.", None),  # "Solve" is not "So"
])
def test_extract_answer(text, want):
    assert extract_answer(text) == want


def test_extract_answer_after_the_thinking_marker():
    assert extract_answer("think 3 </think> The answer is 9", think_end="</think>") == "9"
    assert extract_answer("the answer is 3 </think> 12", think_end="</think>") == "12"
    assert extract_answer("the answer is 3 </think> I do not know.", think_end="</think>") is None


def test_final_answer_patterns_then_last_number():
    assert final_answer("so 3 + 4 = 7. The answer is 7.") == "7"
    assert final_answer("\\boxed{1,000} and then 5") == "1000"
    assert final_answer("She makes 9 * 2 = $18 a day.") == "18"
    assert final_answer("16-3-4 = 9") == "9"  # the minus between operands is no sign
    assert final_answer("It is 18.0 in the end") == "18"
    assert final_answer("Therefore, she makes 7 dollars. Then she buys 2 more.") == "7"
    assert final_answer("no digits here") is None
    assert final_answer("a 5 </think> nothing here", think_end="</think>") is None  # only after the marker


def test_split_reasoning_with_a_marker():
    text = "Let me think.\n16 - 3 = 13 </think>\n\nThe answer is 13."
    assert split_reasoning(text, "</think>") == ("Let me think.\n16 - 3 = 13", "The answer is 13.")
    assert split_reasoning("a </think> b </think> c", "</think>") == ("a </think> b", "c")
    assert split_reasoning("thinking cut off", "</think>") == ("", "thinking cut off")  # no marker


def test_split_reasoning_without_a_marker_takes_the_last_line():
    text = "She sells 9 eggs.\n\nShe makes 9 * 2 = 18 dollars.\n\nTherefore, Janet makes 18 dollars per day.\n\n"
    reasoning, content = split_reasoning(text)
    assert content == "Therefore, Janet makes 18 dollars per day."
    assert reasoning == "She sells 9 eggs.\n\nShe makes 9 * 2 = 18 dollars."
    assert (reasoning + "\n\n" + content).split() == text.split()  # together they cover the text
    assert split_reasoning("x\n#### 18") == ("x", "#### 18")
    assert split_reasoning("just one line") == ("", "just one line")
    assert split_reasoning("") == ("", "")


def test_reference_from():
    assert reference_from(GSM8K_ANSWER) == "18"
    assert reference_from("Total: 1,000 + 234 = 1,234\n#### 1,234") == "1234"
    assert reference_from("18") == "18"
    assert reference_from(" $1,000 ") == "1000"
    assert reference_from(18) == "18"
    assert reference_from(18.0) == "18"
    assert reference_from(0.5) == "0.5"
    assert reference_from("\\frac{3}{4}") == "\\frac{3}{4}"
    assert reference_from(None) is None
    assert reference_from("") is None
    assert reference_from("   ") is None


# (answer, reference, expected): the answer a model gave, the reference as an input holds it
CHECKS = [
    # equal
    ("18", "18", True),
    ("18.0", "18", True),
    ("18", "18.00", True),
    ("$18", "18", True),
    ("\\$18", "18", True),
    ("$1,000", "1000", True),
    ("1,000", "1000", True),
    ("1,234.5", "1234.5", True),
    ("€12", "12", True),
    ("624 dollars", "624", True),
    ("1/2", "0.5", True),
    ("0.5", "1/2", True),
    ("\\frac{1}{2}", "0.5", True),
    ("\\frac{3}{4}", "0.75", True),
    ("\\dfrac{3}{4}", "3/4", True),
    ("0.75", "\\frac{3}{4}", True),
    ("6/8", "3/4", True),
    ("-3", "-3", True),
    ("-0.5", "-1/2", True),
    ("25%", "25", True),  # a percentage is its number (GSM8K writes "#### 25" for 25%)
    ("25\\%", "25", True),
    ("\\boxed{18}", "18", True),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("2^{10}", "1024", True),
    ("\\sqrt{8}", "2\\sqrt{2}", True),
    ("x + 1", "1 + x", True),
    ("0.333333", "1/3", True),  # math-verify compares decimals to 6 places
    ("007", "7", True),
    # not equal
    ("18", "18.5", False),
    ("18.5", "18", False),
    ("-3", "3", False),
    ("3", "-3", False),
    ("0.333", "1/3", False),  # a rounding of 1/3, not 1/3 (to 6 places it differs)
    ("25%", "0.25", False),  # percentages keep their number, so 25% is 25
    ("1000", "100", False),
    ("1/2", "2", False),
    ("\\frac{3}{4}", "0.7", False),
    ("12", "1,234", False),
    ("\\boxed{17}", "18", False),
    ("624", "18", False),
    ("x + 1", "x + 2", False),
    ("abc", "18", False),
    ("9^{9^{9}}", "5", False),  # too slow to evaluate: not given to math-verify
]


@pytest.mark.parametrize("answer, reference, expected", CHECKS)
def test_is_correct(answer, reference, expected):
    assert is_correct(answer, reference) is expected


@pytest.mark.parametrize("answer, reference", [("18", None), (None, None), ("18", " ")])
def test_is_correct_is_none_without_a_reference(answer, reference):
    assert is_correct(answer, reference) is None


@pytest.mark.parametrize("answer", [None, ""])
def test_no_answer_against_a_reference_is_wrong(answer):
    assert is_correct(answer, "18") is False


def test_answers_sympy_would_evaluate_for_minutes_are_compared_as_numbers():
    import time

    t0 = time.perf_counter()
    assert is_correct("(10!)!", "18") is False and is_correct("9^{9^{9}}", "18") is False
    assert time.perf_counter() - t0 < 5


def test_numeric_fallback_when_math_verify_cannot_parse(monkeypatch):
    monkeypatch.setattr(answers, "_math_verify", lambda reference, answer: None)
    assert is_correct("1/2", "0.5") is True
    assert is_correct("\\frac{3}{4}", "0.75") is True
    assert is_correct("18.5", "18") is False
    assert is_correct("0.333", "1/3") is False
    assert is_correct("x + 1", "1 + x") is False  # not numbers: only equal strings match


def test_is_correct_in_a_worker_thread():
    # math-verify's default timeouts use signals, which fail outside the main thread
    results, errors = [], []

    def check():
        try:
            results.extend(is_correct(a, r) for a, r, _ in CHECKS)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    t = threading.Thread(target=check)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive() and not errors
    assert results == [expected for _, _, expected in CHECKS]


def test_is_correct_from_several_threads_at_once():
    # the threads share one helper process, one check at a time
    outcomes, errors = {}, []

    def check(i):
        try:
            outcomes[i] = [is_correct(a, r) for a, r, _ in CHECKS]
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=check, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and all(not t.is_alive() for t in threads)
    assert outcomes == {i: [expected for _, _, expected in CHECKS] for i in range(4)}


def test_is_correct_in_a_daemonic_spawned_child():
    # `semjobs run`'s engine processes are daemonic children, which multiprocessing forbids
    # to start children of their own; a helper that could not start would make this False
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # Pool's workers are daemonic
        assert pool.apply(is_correct, ("\\sqrt{8}", "2\\sqrt{2}")) is True


# A check for the helper process that is slow on demand: no sympy input need be found that is
# slow. "yes" is right whatever the reference, so a True for it can only come from the helper.
SLEEPY_CHECK = """
import time

def check(reference, answer):
    if answer == "1/2":
        time.sleep(60)
    return answer == "yes"
"""


@pytest.fixture
def sleepy_checker(tmp_path, monkeypatch):
    """answers' helper process running SLEEPY_CHECK, with a time limit of 1 s."""
    (tmp_path / "sleepy_check.py").write_text(SLEEPY_CHECK)
    monkeypatch.syspath_prepend(tmp_path)  # the helper gets this process's sys.path
    checker = CheckProcess("sleepy_check:check", warm_up=("1", "1"))
    monkeypatch.setattr(answers, "_checker", checker)
    monkeypatch.setattr(answers, "MATH_VERIFY_TIME_LIMIT_S", 1.0)
    yield checker
    checker.close()


def test_a_check_past_the_time_limit_compares_numbers_within_the_limit(sleepy_checker):
    assert is_correct("yes", "18") is True  # the helper's verdict
    t0 = time.perf_counter()
    assert is_correct("1/2", "0.5") is True  # the helper sleeps: the numbers are equal
    assert time.perf_counter() - t0 < 3
    assert is_correct("1/2", "0.4") is False


def test_the_helper_is_restarted_after_a_timeout(sleepy_checker):
    assert is_correct("yes", "18") is True
    first = sleepy_checker.pid
    is_correct("1/2", "0.5")
    assert sleepy_checker.pid is None  # killed
    assert is_correct("yes", "18") is True
    assert sleepy_checker.pid not in (None, first)


def test_threads_waiting_behind_a_timeout_get_their_verdicts(sleepy_checker):
    verdicts = [None] * 4

    def check(i, answer):
        verdicts[i] = is_correct(answer, "0.5")

    assert is_correct("yes", "18") is True  # the helper runs
    answers_given = ("1/2", "yes", "yes", "yes")
    threads = [threading.Thread(target=check, args=(i, a)) for i, a in enumerate(answers_given)]
    threads[0].start()
    deadline = time.monotonic() + 10
    while not sleepy_checker._lock.locked() and time.monotonic() < deadline:  # the slow check is on
        time.sleep(0.01)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert verdicts == [True, True, True, True]  # 1/2 = 0.5 as numbers, "yes" by the restarted helper


def test_what_a_dataset_keeps():
    """Right by the reference (a loop cut after a right answer too); without one, ended by
    itself with an answer; never a sample the doom rule stopped, its text broken off."""
    from semspec.answers import is_kept

    assert is_kept(True, "4", "repetition") and not is_kept(False, "4", "eos")
    assert is_kept(None, "4", "eos") and not is_kept(None, "4", "length") and not is_kept(None, None, "eos")
    assert not is_kept(True, "4", "doomed") and not is_kept(None, "4", "doomed")

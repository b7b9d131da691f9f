from fractions import Fraction

import pytest

from semspec.calibration.numbers import extract_numbers, numbers_consistent, stated_values


def vals(text):
    return [float(v) for v in extract_numbers(text)]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She sells 9 eggs for $2 each, so she makes $18.", [9, 2, 18]),
        ("Selling nine eggs at two dollars each gives 18 dollars.", [9, 2, 18]),
        ("1,000 and 3.5 and 2.5 million", [1000, 3.5, 2_500_000]),
        ("two hundred and forty-five apples and twenty five pears", [245, 25]),
        ("one thousand two hundred", [1200]),
        ("a hundred people", [100]),
        ("two dozen eggs, a dozen, 3 dozen", [24, 12, 36]),
        ("60% of it, sixty percent, 0.6", [0.6, 0.6, 0.6]),
        ("it leaves at 3:30", [3.5]),
        ("16 - 3 - 4 = 9", [16, 3, 4, 9]),
        ("10/2 = 5", [10, 2, 5]),
        ("half of 10 is 5", [2, 10, 5]),
        ("twice as many", [2]),
        ("three four", [3, 4]),
        ("no numbers here", []),
    ],
)
def test_extract_numbers(text, expected):
    assert vals(text) == pytest.approx(expected)


def test_one_is_ignored_in_comparison():
    assert stated_values("one of the 3 boxes") == frozenset({Fraction(3)})


def test_design_example_numbers():
    a = "She sells 9 eggs for $2 each, so she makes $18."
    assert numbers_consistent(a, "Selling nine eggs at two dollars each gives 18 dollars.")
    assert not numbers_consistent(a, "She sells 7 eggs for $2 each, so she makes $14.")


def test_subset_mode_needs_same_final_number():
    assert numbers_consistent("Two dozen eggs is 2 * 12 = 24 eggs.", "There are 24 eggs in two dozen.")
    assert not numbers_consistent("She makes 9 * 2 = 18 dollars.", "She makes 9 dollars.")
    assert not numbers_consistent("She makes 9 * 2 = 18 dollars.", "She makes money.")
    assert not numbers_consistent(
        "Two dozen eggs is 2 * 12 = 24 eggs.", "There are 24 eggs in two dozen.", mode="equal"
    )
    with pytest.raises(ValueError):
        numbers_consistent("1", "2", mode="bogus")

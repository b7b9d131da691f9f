"""semspec.stepwise: the step-level programs' plumbing that needs no model."""

from __future__ import annotations

from semspec.stepwise import side_by_side


def _asks(name: str, times: int):
    """A sub-program that makes ``times`` calls and returns the replies it got."""
    got = []
    for i in range(times):
        got.append((yield f"{name}{i}"))
    return got


def test_side_by_side_batches_each_round_and_returns_every_result_in_order():
    both = side_by_side([_asks("a", 2), _asks("b", 1), _asks("c", 0)])
    assert next(both) == ["a0", "b0"]
    assert both.send(["ra0", "rb0"]) == ["a1"]  # b is done: only a asks again
    try:
        both.send(["ra1"])
    except StopIteration as stop:
        assert stop.value == [["ra0", "ra1"], ["rb0"], []]
    else:
        raise AssertionError("side_by_side did not end")

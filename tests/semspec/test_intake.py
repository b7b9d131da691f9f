"""semspec.intake: how engines read generate_many's source, aborts included."""

from __future__ import annotations

from semspec.intake import Intake
from semspec.types import Abort, Request


def test_a_full_batch_reads_on_for_aborts_and_holds_back_one_request():
    taken = []

    def source():
        for entry in [Abort("x"), "first", "second", "third"]:
            taken.append(entry)
            yield entry

    intake = Intake(source())
    assert intake.next(room=False) == Abort("x")  # an abort is read however full the batch
    assert intake.next(room=False) is None  # "first" is read, and waits for a slot
    assert intake.next(room=False) is None and taken == [Abort("x"), "first"]  # nothing more is read
    assert intake.next(room=True) == Request("first", None, 1)
    assert intake.next(room=True) == Request("second", None, 2)
    assert intake.next(room=True) == Request("third", None, 3)
    assert intake.next(room=True) is None and intake.exhausted

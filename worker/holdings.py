"""What this process is working on: the items of the chunks it runs and those it decodes.

The database says which worker holds an item; only the process itself knows whether it still
works on it. Two uses: a second delivery of an item that this process is decoding (a chunk
handed out again, a task retried) must not decode it a second time, and the heartbeat hands
back what the database says this process holds but it no longer works on (a chunk that
ended unsettled, or a predecessor that ran under the same name: pid 1 in a restarted
container), since no other worker takes an item from a worker that still beats.
"""

from __future__ import annotations

import threading
from collections import Counter

Key = tuple[str, int]  # (job id, item position)


class Holdings:
    def __init__(self):
        self._chunks: Counter[Key] = Counter()
        self._decoding: set[Key] = set()
        self._lock = threading.Lock()

    def hold(self, job_id: str, seqs: list[int]) -> None:
        """A chunk of these items starts here (before the database records the hold)."""
        with self._lock:
            self._chunks.update((job_id, s) for s in seqs)

    def drop(self, job_id: str, seqs: list[int]) -> None:
        with self._lock:
            self._chunks.subtract((job_id, s) for s in seqs)
            self._chunks = +self._chunks  # forget the zeros

    def begin(self, key: Key) -> bool:
        """Start decoding an item; False when this process decodes it already."""
        with self._lock:
            if key in self._decoding:
                return False
            self._decoding.add(key)
            return True

    def end(self, key: Key) -> None:
        with self._lock:
            self._decoding.discard(key)

    def keys(self) -> set[Key]:
        """Every item this process works on now."""
        with self._lock:
            return set(self._chunks) | self._decoding


holdings = Holdings()

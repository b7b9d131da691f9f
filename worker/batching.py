"""One decoding loop per process, shared by every chunk the process holds.

The engine decodes up to ``batch_size`` items at once (``Engine.generate_many``, continuous
batching). A Celery worker holds several chunks at a time (the threads pool, one chunk per
thread); each chunk's thread claims an item only when the loop has a free slot, hands it
over, and commits its result the moment it comes back. So the batch stays full across
chunk boundaries, every item is claimed just before it starts (a cancelled job's items
never start; those decoding are aborted: ``cancel``), and a chunk's message is acknowledged
only once all of its items are settled.

The loop runs in a thread of its own (torch releases the GIL in its kernels); the threads
that hand it items do all the database work. Nothing here imports Celery.

Heartbeats prove that the process lives, not that its engine makes progress, so the loop
watches the engine too (``is_hung``): an engine turns each time it asks for work (every
decoding step does) or hands back a result; one that holds items and has not turned for a
while is stuck in a request (a chat template that loops, a decode that never returns). Its
thread cannot be stopped, so the loop takes no more items; the chunks fail the item it hung
on (``suspect``) and hand back the rest (``semjobs.worker.process``).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Iterable

from semspec.types import Abort, Request

# An idle engine handed an item waits for the items handed over right behind it (claimed one
# by one, a few milliseconds apart) until none comes for GATHER_QUIET_S, or GATHER_MAX_S
# pass, or the batch is full, and starts them together: a seeded rerun's first steps then see
# the batch its first run saw, instead of its first item decoding alone for a step or two
# (in bfloat16 other batch shapes round otherwise: docs/datasets.md).
GATHER_QUIET_S = 0.1
GATHER_MAX_S = 2.0


class BatchLoop:
    def __init__(self, engine: Any, batch_size: int):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.engine = engine
        self.batch_size = batch_size
        self._inbox: queue.Queue = queue.Queue()
        self._futures: dict[int, Future] = {}
        self._taken = 0  # slots promised to callers (handed over or about to be)
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self.version = 0  # bumped whenever a slot frees, so waiters never miss a wake-up
        self._next_key = 0
        self._in_engine: set[int] = set()  # keys handed to the engine, not finished (the loop thread's)
        self._thread: threading.Thread | None = None
        self._turned_at = time.monotonic()  # when the engine last asked for work or handed back a result
        self._taking: int | None = None  # the key it took at that turn, until it turns again
        self._hung = False

    # ------------------------------------------------------------------ callers' side
    def try_reserve(self) -> bool:
        """Take a slot for an item about to be claimed; False when the batch is full (or the
        engine is hung: it would never decode it)."""
        with self._lock:
            if self._hung or self._taken >= self.batch_size:
                return False
            self._taken += 1
            return True

    def unreserve(self) -> None:
        """Give back a reserved slot that was not used (the claim found nothing to do)."""
        with self._lock:
            self._free_slot()

    def submit(self, prompt, config) -> Future:
        """Decode one item in a reserved slot; the future holds its GenerationResult."""
        fut: Future = Future()
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._futures[key] = fut
            self._inbox.put(Request(prompt, config, key=key))
            self._ensure_thread()
        return fut

    def cancel(self, futures: Iterable[Future]) -> None:
        """Abort these items in the engine (their job was cancelled): each still decoding
        ends with semspec.types.Cancelled, its slot freed; one that finishes first keeps its
        result."""
        futures = set(futures)
        with self._lock:
            for key, fut in self._futures.items():
                if fut in futures:  # after its Request in the inbox, so the engine has it
                    self._inbox.put(Abort(key))

    def is_hung(self, timeout: float) -> bool:
        """Whether the engine has held items without turning for ``timeout`` seconds. Once
        hung, for good: its thread is stuck in the engine, which no other may step."""
        with self._lock:
            if not self._hung and self._in_engine and time.monotonic() - self._turned_at > timeout:
                self._hung = True
            return self._hung

    def suspect(self) -> Future | None:
        """The item a hung engine is stuck on, where that can be told: the one it was
        starting (it took it and never asked for more), else the only one it held. None when
        it hung while decoding several."""
        with self._lock:
            held = tuple(self._in_engine)
            key = self._taking if self._taking is not None else (held[0] if len(held) == 1 else None)
            return self._futures.get(key)

    def wait(self, seen: int, timeout: float) -> int:
        """Block until a slot frees after ``seen`` (a ``version``) or ``timeout`` passes."""
        with self._lock:
            if self.version == seen:
                self.changed.wait(timeout)
            return self.version

    # ------------------------------------------------------------------ the loop
    def _free_slot(self) -> None:
        self._taken -= 1
        self.version += 1
        self.changed.notify_all()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            inbox = self._inbox
            self._thread = threading.Thread(target=self._run, args=(inbox,), name="semjobs-batch-loop",
                                            daemon=True)
            self._thread.start()

    def _turn(self) -> None:
        """The engine asks for work or hands back a result: it is not stuck."""
        self._turned_at = time.monotonic()
        self._taking = None

    def _requests(self, inbox: queue.Queue):
        """Items (and Abort markers) as they are handed over. While the engine has items, an
        empty inbox is "nothing new now" (None: the engine goes on decoding), but for the
        items that follow one an idle engine was handed (GATHER_QUIET_S); when it has none,
        wait."""
        gather_until = 0.0  # while gathering: when it ends at the latest
        while True:
            self._turn()
            if not self._in_engine:
                req = inbox.get()
                self._turn()  # idle until now, not stuck
                gather_until = time.monotonic() + GATHER_MAX_S
            else:
                try:
                    if len(self._in_engine) >= self.batch_size or time.monotonic() >= gather_until:
                        gather_until = 0.0
                        req = inbox.get_nowait()
                    else:
                        req = inbox.get(timeout=max(0.0, min(GATHER_QUIET_S, gather_until - time.monotonic())))
                except queue.Empty:
                    gather_until = 0.0
                    yield None
                    continue
            if req is _CLOSE:  # the engine runs out of new work: it ends once what it holds is done
                return
            if not isinstance(req, Abort):
                self._in_engine.add(req.key)
                self._taking = req.key
            yield req

    def close(self) -> None:
        """End the loop's thread once the items the engine holds are done, so nothing refers
        to the engine any more and it can be freed; wait for that."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            self._inbox.put(_CLOSE)
            if self._hung:  # stuck in the engine: it would never end
                return
        thread.join()

    def _run(self, inbox: queue.Queue) -> None:
        try:
            for done in self.engine.generate_many(self._requests(inbox), batch_size=self.batch_size):
                self._in_engine.discard(done.key)
                self._turn()
                with self._lock:
                    fut = self._futures.pop(done.key)
                # settled before its slot frees: a caller woken by the slot finds it done
                if done.error is not None:
                    fut.set_exception(done.error)
                else:
                    fut.set_result(done.result)
                with self._lock:
                    self._free_slot()
        except BaseException as e:  # the engine itself failed: every item handed over fails
            with self._lock:
                stranded = list(self._futures.values())
                self._futures.clear()
                # the next submit starts a fresh loop on a fresh inbox
                self._in_engine = set()
                self._inbox = queue.Queue()
                self._thread = None
            for fut in stranded:
                fut.set_exception(e)
            with self._lock:
                for _ in stranded:
                    self._free_slot()


_CLOSE = object()  # in an inbox: no more items will come (BatchLoop.close)
_loops: dict[tuple[int, int], BatchLoop] = {}
_loops_lock = threading.Lock()


def batch_loop(engine: Any, batch_size: int) -> BatchLoop:
    """This process's loop for ``engine`` (one per engine: a new batch size replaces it)."""
    with _loops_lock:
        loop = _loops.get((id(engine), batch_size))
        replaced = []
        if loop is None:
            replaced = _drop(engine)
            loop = _loops[(id(engine), batch_size)] = BatchLoop(engine, batch_size)
    for old in replaced:
        old.close()
    return loop


def forget_loop(engine: Any) -> None:
    """Drop ``engine``'s loop (the engine is being unloaded) and end its thread once what
    it decodes is done, so the engine can be freed."""
    with _loops_lock:
        dropped = _drop(engine)
    for loop in dropped:
        loop.close()


def _drop(engine: Any) -> list[BatchLoop]:
    return [_loops.pop(k) for k in [k for k in _loops if k[0] == id(engine)]]

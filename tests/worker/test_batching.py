"""The per-process batch loop (`semjobs.worker.batching.BatchLoop`) with the instant test-double
engine: slots are shared by every caller, a freed slot wakes waiters, a cancel aborts the
items it names, an engine failure fails what it held and the next item starts a fresh loop."""

from __future__ import annotations

import threading
import time

import pytest

from semspec.types import Cancelled, GenerationConfig, Request
from tests.conftest import wait_for
from tests.fake_engine import InstantEngine
from semjobs.worker.batching import GATHER_QUIET_S, BatchLoop

CFG = GenerationConfig(max_new_tokens=8)


def test_slots_are_shared_and_results_come_back():
    loop = BatchLoop(InstantEngine(delay_s=0.05), batch_size=2)
    assert loop.try_reserve() and loop.try_reserve()
    assert not loop.try_reserve()  # the batch is full
    seen = loop.version
    futs = [loop.submit(f"question {i}", CFG) for i in range(2)]
    assert loop.wait(seen, timeout=5) > seen  # a slot freed
    assert [f.result(timeout=5).final_answer for f in futs] == ["2", "2"]
    assert loop.try_reserve()  # both slots are free again
    loop.unreserve()


def test_items_of_several_callers_run_side_by_side():
    loop = BatchLoop(InstantEngine(delay_s=0.3), batch_size=4)
    results = {}

    def caller(name):
        futs = []
        for i in range(2):
            while not loop.try_reserve():
                time.sleep(0.01)
            futs.append(loop.submit(f"{name} {i}", CFG))
        results[name] = [f.result(timeout=10) for f in futs]

    t0 = time.monotonic()
    threads = [threading.Thread(target=caller, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # four items of 0.3 s each in one batch of four: well under the 1.2 s of one at a time
    assert time.monotonic() - t0 < 0.9
    assert sorted(results) == ["a", "b"] and all(len(r) == 2 for r in results.values())


class RecordingEngine(InstantEngine):
    """Records what the engine took from the loop, in order: item keys, and None where it
    found nothing new and stepped."""

    def __init__(self, delay_s: float):
        super().__init__(delay_s)
        self.took: list[int | None] = []

    def generate_many(self, requests, config=None, batch_size=1):
        def recording(source):
            for req in source:
                self.took.append(None if req is None else req.key)
                yield req

        yield from super().generate_many(recording(requests), config, batch_size)


def test_items_handed_over_one_by_one_to_an_idle_engine_start_together():
    """Claimed a few milliseconds apart, a run's first items start in one batch: its first
    step is the same in a rerun, instead of the first item decoding alone for a while."""
    engine = RecordingEngine(delay_s=0.3)
    loop = BatchLoop(engine, batch_size=4)
    futs = []
    for i in range(3):
        assert loop.try_reserve()
        futs.append(loop.submit(f"question {i}", CFG))
        time.sleep(GATHER_QUIET_S / 3)
    assert all(f.result(timeout=5).text for f in futs)
    assert engine.took[:4] == [0, 1, 2, None]  # all three before its first step
    # a lone item waits no longer than the quiet spell; a full batch not at all
    single = RecordingEngine(delay_s=0.0)
    one = BatchLoop(single, batch_size=1)
    one.try_reserve()
    t0 = time.monotonic()
    one.submit("alone", CFG).result(timeout=5)
    assert time.monotonic() - t0 < GATHER_QUIET_S / 2


def test_cancel_aborts_only_the_items_named_and_frees_their_slots():
    loop = BatchLoop(InstantEngine(delay_s=30), batch_size=2)
    assert loop.try_reserve() and loop.try_reserve()
    mine, other = loop.submit("mine", CFG), loop.submit("another job's", CFG)
    seen = loop.version
    t0 = time.monotonic()
    loop.cancel([mine])  # the batch is full: the engine hears of it all the same
    with pytest.raises(Cancelled):
        mine.result(timeout=5)
    assert time.monotonic() - t0 < 1 and loop.wait(seen, timeout=5) > seen  # its slot freed
    assert loop.try_reserve()
    loop.unreserve()
    assert not other.done()


class _Exploding(InstantEngine):
    def __init__(self):
        super().__init__()
        self.explode = True

    def generate_many(self, requests, config=None, batch_size=1):
        if self.explode:
            self.explode = False
            next(iter(requests))
            raise MemoryError("engine blew up")
        yield from super().generate_many(requests, config, batch_size)


def test_an_engine_failure_fails_its_items_and_the_loop_starts_again():
    loop = BatchLoop(_Exploding(), batch_size=2)
    loop.try_reserve()
    with pytest.raises(MemoryError):
        loop.submit("first", CFG).result(timeout=5)
    assert loop.try_reserve() and loop.try_reserve()  # the failed item's slot came back
    loop.unreserve()
    assert loop.submit("second", CFG).result(timeout=5).text


def test_forgetting_an_engine_ends_its_loop_once_its_items_are_done():
    """An engine being swapped out is freed: its loop's thread, which refers to it, ends once
    the items it holds are done (nothing in flight is dropped)."""
    import gc
    import weakref

    from semjobs.worker.batching import batch_loop, forget_loop

    engine = InstantEngine(delay_s=0.2)
    loop = batch_loop(engine, 2)
    assert loop.try_reserve()
    fut = loop.submit("question 1", CFG)
    forget_loop(engine)  # returns once the loop's thread has ended
    assert fut.result(timeout=0).final_answer == "2" and not loop._thread.is_alive()
    gone = weakref.ref(engine)
    del engine, loop
    gc.collect()
    assert gone() is None


class HangingEngine(InstantEngine):
    """The instant engine, stuck (until ``release`` is set, at most 60 s) where a prompt says:
    HANG while taking it, as one whose chat template loops would be; STALL while decoding it,
    beside the others it holds. Either way its loop stops turning.
    Select it with SEMJOBS_ENGINE_FACTORY=tests.worker.test_batching:HangingEngine.load."""

    def __init__(self, delay_s: float = 0.0):
        super().__init__(delay_s)
        self.release = threading.Event()

    def generate_many(self, requests, config=None, batch_size=1):
        def taking(source):
            for req in source:
                if isinstance(req, Request) and "HANG" in str(req.prompt):
                    self.release.wait(60)
                yield req

        yield from super().generate_many(taking(requests), config, batch_size)

    def _answer(self, prompt, config):
        if "STALL" in str(prompt):
            self.release.wait(60)
        return super()._answer(prompt, config)


def test_an_engine_that_stops_turning_is_hung_and_names_the_item_it_was_starting():
    engine = HangingEngine()
    loop = BatchLoop(engine, batch_size=4)
    for _ in range(3):
        loop.try_reserve()
    assert loop.submit("question 1", CFG).result(timeout=5).text  # it turns: decodes, idles
    assert not loop.is_hung(timeout=0.3), "an idle engine holds nothing: it is not hung"
    stuck = loop.submit("HANG here", CFG)
    loop.submit("question 3", CFG)  # waits in the inbox: the engine never takes it
    assert not loop.is_hung(timeout=5)
    wait_for(lambda: loop.is_hung(timeout=0.3), timeout=5, what="the watchdog")
    assert loop.suspect() is stuck
    assert not loop.try_reserve(), "no item goes to a hung engine"
    t0 = time.monotonic()
    loop.close()  # a stuck thread is not waited for
    assert time.monotonic() - t0 < 1
    engine.release.set()


def test_a_slow_decode_turns_the_engine_and_is_not_hung():
    loop = BatchLoop(InstantEngine(delay_s=1.5), batch_size=2)
    loop.try_reserve()
    fut = loop.submit("a long one", CFG)
    while not fut.done():
        assert not loop.is_hung(timeout=0.5)  # it asks for work every 20 ms while it decodes
        time.sleep(0.05)
    assert fut.result().text


def test_an_engine_hung_while_decoding_several_names_no_suspect():
    """Which of the items it decodes it hung on cannot be told: none is blamed."""
    engine = HangingEngine(delay_s=0.3)  # both are taken before the first is due
    loop = BatchLoop(engine, batch_size=2)
    assert loop.try_reserve() and loop.try_reserve()
    loop.submit("STALL here", CFG)
    loop.submit("question 2", CFG)
    wait_for(lambda: loop.is_hung(timeout=0.3), timeout=5, what="the watchdog")
    assert loop.suspect() is None
    engine.release.set()

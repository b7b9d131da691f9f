"""The per-item code: claim -> engine -> commit, each item on its own, many at once.

The Celery task (`semjobs.worker.tasks.run_chunk`) and the embedded mode (`semjobs run`) both call
`run_items`; nothing here imports Celery. Items decode in this process's batch loop
(`semjobs.worker.batching`); every item is claimed when it starts and committed when it finishes,
so a crash loses at most the items in flight, and a redelivered chunk skips what is done.
An engine that hangs (`semjobs.worker.batching.BatchLoop.is_hung`) ends the chunk: the item it hung on
fails with that reason, the rest is handed back (`ChunkReport.left`, `ChunkReport.hung`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from semjobs.db import repo, surplus
from semjobs.db.retry import retrying
from semjobs.db.session import session_factory
from semjobs.jobs.submit import item_config
from semjobs.settings import settings
from semspec.answers import is_correct
from semspec.types import Cancelled
from semjobs.worker import engine as engines
from semjobs.worker.batching import batch_loop
from semjobs.worker.holdings import holdings

log = logging.getLogger(__name__)
_job_configs: dict[str, dict] = {}  # job id -> config (immutable once stored)
_job_rules: dict[str, tuple[int | None, int | None]] = {}  # job id -> (want per input, token budget)
_identities_written: set[str] = set()
# How often a chunk with items decoding asks whether their job was cancelled: a cancel stops
# them within about this, for one small read per chunk and interval.
CANCEL_CHECK_S = 1.0


@dataclass
class ChunkReport:
    done: int = 0
    failed: int = 0
    skipped: int = 0  # already finished, or claimed by nobody (cancelled)
    unneeded: int = 0  # not decoded, or aborted mid-decode: the input had the kept samples it wants
    over_budget: int = 0  # not decoded: the job had spent its token budget
    aborted: int = 0  # stopped mid-decode: the job was cancelled
    duplicates: int = 0  # finished here, but another delivery had stored it first
    late: int = 0  # finished here after the item was settled otherwise (cancelled, failed): not stored
    cancelled: bool = False
    # not done here, to be enqueued again: the chunk ran out of time, or its engine hung
    left: list[int] = field(default_factory=list)
    hung: bool = False  # the engine made no progress for settings.progress_timeout_s: it cannot decode any more


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _job_config(session, job_id: str) -> dict | None:
    cfg = _job_configs.get(job_id)
    if cfg is None:
        job = repo.get_job(session, job_id)
        if job is None:
            return None
        _job_rules[job_id] = (job.manifest.get("want_per_input"), job.manifest.get("budget_tokens"))
        cfg = _job_configs[job_id] = dict(job.config)
    return cfg


def run_items(
    job_id: str,
    seqs: list[int],
    *,
    url: str | None = None,
    worker: str | None = None,
    deadline: float | None = None,
    on_item: Callable[[str, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    refill: Callable[[], list[int]] | None = None,
) -> ChunkReport:
    """Process the items `seqs` of job `job_id` through this process's batch loop (up to
    `settings.batch_size` items decode at once, shared with the other chunks this process
    holds). Each item is claimed when a slot is free and committed when it finishes.
    `deadline` (time.monotonic) stops starting items after it, and so does `should_stop()`
    returning true (a worker shutting down); what did not start is returned in
    `report.left`. `refill()`, called once every seq given has started, gives more seqs of
    the job to run the same way ([]: there are no more), so processes that share a job's
    items take them as they go (`semjobs run`'s engine processes). Returns once every
    started item is settled, or at once when the engine hangs (`report.hung`; what it held,
    but the item it hung on, is in `report.left`)."""
    report = ChunkReport()
    worker = worker or worker_name()
    with session_factory(url, role="worker")() as session:
        config = _job_config(session, job_id)
        if config is None:
            report.skipped = len(seqs)
            return report
        # Load first (minutes, once per process), so no transaction stays open meanwhile;
        # held in use while the chunk decodes, so no other chunk's job swaps it away
        with engines.in_use(*engine_request(config)) as engine:  # raises EngineLoadError, EngineBusy
            loop = batch_loop(engine, settings.batch_size)
            # Nothing is in flight yet: a database outage here ends the task, which retries.
            repo.mark_job_running(session, job_id, None if job_id in _identities_written
                                  else engines.identities(engine))
            holdings.hold(job_id, seqs)  # before the database says so: see semjobs.worker.holdings
            chunk = None
            try:
                repo.hold_items(session, job_id, seqs, worker)
                session.commit()
                _identities_written.add(job_id)
                chunk = _Chunk(session, job_id, list(seqs), worker, config, loop, report, on_item,
                               *_job_rules.get(job_id, (None, None)), refill=refill)
                try:
                    chunk.run(deadline, should_stop)
                except BaseException:  # the chunk ends unsettled: what it decodes is no longer
                    chunk.abandon()    # worked on once the decode ends (the heartbeat hands it back)
                    raise
            finally:
                holdings.drop(job_id, chunk.seqs if chunk is not None else seqs)
        retrying(session, lambda: repo.finalize_job(session, job_id), "finishing the job")
    return report


def engine_request(config: dict | None) -> tuple[str | None, int | None]:
    """What a job's config asks of the engine (``semjobs.worker.engine.get_engine``'s arguments): its
    method and the tokens it drafts per verification."""
    if config is None:
        return None, None
    return config.get("method"), config.get("draft_tokens")


def job_engine_request(job_id: str, url: str | None = None) -> tuple[str | None, int | None]:
    """``engine_request`` of job ``job_id`` ((None, None) when there is no such job)."""
    with session_factory(url, role="worker")() as session:
        return engine_request(_job_config(session, job_id))


def fail_unstarted(job_id: str, seqs: list[int], reason: str, url: str | None = None) -> int:
    """Fail the items of ``seqs`` that no worker has started or holds (this worker cannot
    serve them: its engine does not load), with ``reason``; the job ends once nothing is
    left. Returns how many failed."""
    with session_factory(url, role="worker")() as session:
        failed = retrying(session, lambda: repo.fail_pending(session, job_id, seqs, reason), "failing items")
        retrying(session, lambda: repo.finalize_job(session, job_id), "finishing the job")
    return failed


class _Chunk:
    """One chunk's items through the shared batch loop: claim as slots free, commit as
    items finish."""

    def __init__(self, session, job_id, seqs, worker, config, loop, report, on_item, want=None, budget=None,
                 refill=None):
        self.session, self.job_id, self.seqs, self.worker = session, job_id, seqs, worker
        self.refill = refill  # more seqs once these have started (run_items)
        self.config, self.loop, self.report, self.on_item = config, loop, report, on_item
        self.want = want  # the job's kept samples wanted per input (a line's own `want` wins)
        self.budget = budget  # tokens the job may generate
        self.spent_checked = (-1.0, 0)  # (time.monotonic(), tokens the job had spent then)
        # future -> (item pk, seq, the input's reference answer)
        self.in_flight: dict[Future, tuple[int, int, str | None]] = {}
        # future -> (input id, kept samples it wants), for the items whose input wants some
        self.wanting: dict[Future, tuple[str, int]] = {}
        self.surplus: set[Future] = set()  # aborted: their input had what it wants
        self.next_cancel_check = 0.0  # time.monotonic()
        self.next_surplus_check = 0.0
        self.abort_sent = False

    def run(self, deadline, should_stop) -> None:
        i = 0
        while True:
            seen = self.loop.version  # before looking: a slot freed after this wakes the wait
            self.settle_finished()
            if i >= len(self.seqs) and self.refill is not None:
                self.take_more()
            if i < len(self.seqs) and i > 0 and ((deadline is not None and time.monotonic() > deadline)
                                                 or (should_stop is not None and should_stop())):
                self.report.left = list(self.seqs[i:])
                retrying(self.session, self._release_left, "handing items back")  # the caller requeues them
                i = len(self.seqs)
                self.refill = None  # stopping: take no more
            if i < len(self.seqs) and self.loop.try_reserve():
                if not self.start(self.seqs[i]):
                    self.loop.unreserve()
                    if self.report.cancelled:  # the job was cancelled: start nothing more
                        rest = self.seqs[i:]
                        retrying(self.session, lambda: repo.cancel_leftovers(self.session, self.job_id, rest),
                                 "cancelling the rest")
                        i = len(self.seqs)
                        continue
                i += 1
                continue
            if i >= len(self.seqs) and not self.in_flight:
                return
            if self.loop.is_hung(settings.progress_timeout_s):
                self.give_up_on_hung_engine(self.seqs[i:])
                return
            self.abort_if_cancelled()
            self.abort_surplus()
            self.loop.wait(seen, timeout=CANCEL_CHECK_S)

    def take_more(self) -> None:
        """Append the next seqs ``refill`` gives, held as the first ones were; none left: stop asking."""
        more = [] if self.report.cancelled else self.refill()
        if not more:
            self.refill = None
            return
        holdings.hold(self.job_id, more)
        retrying(self.session, lambda: self._hold(more), "holding items")
        self.seqs.extend(more)

    def _hold(self, seqs: list[int]) -> None:
        repo.hold_items(self.session, self.job_id, seqs, self.worker)
        self.session.commit()

    def abort_if_cancelled(self) -> None:
        """Abort the items in flight once their job is cancelled (each then ends Cancelled and
        is settled so). Asked only while items decode: a claim finds out by itself."""
        if not self.in_flight or self.abort_sent:
            return
        if not self.report.cancelled:  # else a claim found out
            if time.monotonic() < self.next_cancel_check:
                return
            self.next_cancel_check = time.monotonic() + CANCEL_CHECK_S
            if not retrying(self.session, self._job_cancelled, "reading the job"):
                return
            self.report.cancelled = True  # the next claim finds nothing and cancels the rest
        self.abort_sent = True  # nothing starts after a cancel: these are all there will be
        self.loop.cancel(self.in_flight)

    def abort_surplus(self) -> None:
        """Abort the items in flight whose input has, meanwhile, the kept samples it wants
        (stored by any worker); each then ends Cancelled and is settled unneeded. Asked every
        CANCEL_CHECK_S while such items decode."""
        live = {fut: want for fut, want in self.wanting.items() if fut not in self.surplus}
        if not live or time.monotonic() < self.next_surplus_check:
            return
        self.next_surplus_check = time.monotonic() + CANCEL_CHECK_S
        wants = dict(live.values())
        done = retrying(self.session, lambda: self._satisfied(wants), "reading kept samples")
        aborted = [fut for fut, (item_id, _) in live.items() if item_id in done]
        if aborted:
            self.surplus.update(aborted)
            self.loop.cancel(aborted)

    def _satisfied(self, wants: dict[str, int]) -> set[str]:
        found = surplus.satisfied(self.session, self.job_id, wants)
        self.session.commit()  # ends the read: no transaction stays open while items decode
        return found

    def _job_cancelled(self) -> bool:
        cancelled = repo.job_is_cancelled(self.session, self.job_id)
        self.session.commit()  # ends the read: no transaction stays open while items decode
        return cancelled

    def give_up_on_hung_engine(self, unstarted: list[int]) -> None:
        """The engine is hung: fail the item it hung on, when it is this chunk's and can be
        told (``BatchLoop.suspect``), with the reason; hand back the others in flight and those
        not started (``report.left``: the caller enqueues them again, for other workers).
        Their decodes are abandoned: whatever the stuck engine makes of them is never stored."""
        self.report.hung = True
        suspect = self.loop.suspect()
        reason = (f"no progress for {settings.progress_timeout_s:g} s: the engine hung on this item "
                  f"(worker {self.worker}; the other items it held were handed back)")
        failed, in_flight = [], []
        for fut, (pk, seq, _ref) in self.in_flight.items():
            if fut is suspect:
                if retrying(self.session, lambda: repo.fail_item(self.session, pk, reason, self.worker),
                            "failing an item"):
                    failed.append(seq)
            else:
                in_flight.append(seq)
            holdings.end((self.job_id, seq))
        self.in_flight.clear()
        keys = [(self.job_id, seq) for seq in in_flight + unstarted]
        released = retrying(self.session, lambda: self._release_held(keys), "handing items back")
        self.report.failed += len(failed)
        self.report.left += released.get(self.job_id, [])
        log.warning("job %s: the engine made no progress for %g s; failed item(s) %s, handed back %s",
                    self.job_id, settings.progress_timeout_s, failed, self.report.left)
        for seq in failed:
            if self.on_item:
                self.on_item("failed", seq)

    def _release_held(self, keys: list[tuple[str, int]]) -> dict[str, list[int]]:
        released = repo.release_held(self.session, self.worker, keys)
        self.session.commit()
        return released

    def abandon(self) -> None:
        for fut, (_pk, seq, _ref) in self.in_flight.items():
            fut.add_done_callback(lambda _f, key=(self.job_id, seq): holdings.end(key))

    def _release_left(self) -> None:
        repo.release_items(self.session, self.job_id, self.report.left, self.worker)
        self.session.commit()

    def start(self, seq: int) -> bool:
        """Claim one item and hand it to the loop; False when there was nothing to start."""
        key = (self.job_id, seq)
        if not holdings.begin(key):  # another chunk of this process decodes it
            self.report.skipped += 1
            return False
        started = False
        try:
            started = self._claim(seq)
        finally:
            if not started:
                holdings.end(key)
        return started

    def _claim(self, seq: int) -> bool:
        s, job_id = self.session, self.job_id
        claim = retrying(s, lambda: repo.claim_item(s, job_id, seq, self.worker,
                                                       settings.worker_dead_after_s), "claiming an item")
        if claim is None:
            if retrying(s, lambda: repo.job_is_cancelled(s, job_id), "reading the job"):
                self.report.cancelled = True
            else:
                self.report.skipped += 1
            return False
        if claim.attempts > settings.max_attempts:
            reason = (f"gave up after {claim.attempts - 1} deliveries that never finished "
                      f"(max_attempts={settings.max_attempts}; was the worker killed, or its engine hung?)")
            if retrying(s, lambda: repo.fail_item(s, claim.pk, reason, self.worker), "failing an item"):
                self.report.failed += 1
            return False
        request = claim.request
        want = request.get("want") or self.want
        if want and claim.item_id in retrying(s, lambda: self._satisfied({claim.item_id: want}),
                                              "reading kept samples"):
            self._settle_unneeded(claim.pk, seq)
            return False
        if self.budget is not None and self._spent() >= self.budget:
            self._settle_unneeded(claim.pk, seq, status="over_budget")
            return False
        fut = self.loop.submit(request.get("messages") or request["prompt"],
                               item_config(self.config, request, claim.sample))
        self.in_flight[fut] = (claim.pk, seq, request.get("reference"))
        if want:
            self.wanting[fut] = (claim.item_id, want)
        return True

    def _spent(self) -> int:
        """The job's spent tokens: read at most once per CANCEL_CHECK_S (a sum over its items),
        with what this chunk's results spent since added."""
        at, spent = self.spent_checked
        if time.monotonic() - at > CANCEL_CHECK_S:
            spent = retrying(self.session, self._read_spent, "reading spent tokens")
            self.spent_checked = (time.monotonic(), spent)
        return spent

    def _read_spent(self) -> int:
        spent = surplus.spent_tokens(self.session, self.job_id)
        self.session.commit()  # ends the read: no transaction stays open while items decode
        return spent

    def _settle_unneeded(self, pk: int, seq: int, spent_tokens: int = 0, status: str = "unneeded") -> None:
        if retrying(self.session, lambda: surplus.settle_unneeded(self.session, self.job_id, pk, self.worker,
                                                                  spent_tokens, status), "settling an item"):
            setattr(self.report, status, getattr(self.report, status) + 1)
            if self.on_item:
                self.on_item(status, seq)

    def settle_finished(self) -> None:
        for fut in [f for f in self.in_flight if f.done()]:
            pk, seq, reference = self.in_flight.pop(fut)
            self.wanting.pop(fut, None)
            try:
                self._settle(fut, pk, seq, reference)
            finally:
                holdings.end((self.job_id, seq))

    def _settle(self, fut: Future, pk: int, seq: int, reference: str | None) -> None:
        error = fut.exception()
        if isinstance(error, Cancelled) and fut in self.surplus:  # aborted by abort_surplus
            self.surplus.discard(fut)
            self._settle_unneeded(pk, seq, error.generated_tokens)
            return
        if isinstance(error, Cancelled):  # aborted by abort_if_cancelled
            retrying(self.session, lambda: repo.cancel_running(self.session, pk, self.worker), "cancelling an item")
            self.report.aborted += 1
            if self.on_item:
                self.on_item("cancelled", seq)
            return
        if error is not None:  # the engine failed on this item: record it, go on
            tail = "".join(traceback.format_exception_only(type(error), error)).strip()
            if retrying(self.session, lambda: repo.fail_item(self.session, pk, tail, self.worker),
                        "failing an item"):
                self.report.failed += 1
                outcome = "failed"
            else:
                outcome = self._came_late(pk, seq, "failure")
            if self.on_item:
                self.on_item(outcome, seq)
            return
        # committed at once: other items of the batch may decode for minutes more
        result = fut.result()
        correct = is_correct(result.final_answer, reference)
        if retrying(self.session, lambda: repo.save_result(self.session, self.job_id, pk, result, correct),
                    "storing a result"):
            self.report.done += 1
            outcome = "done"
            at, spent = self.spent_checked  # what this chunk knows the job spent, until the next read
            self.spent_checked = (at, spent + result.counters.generated_tokens + result.counters.cut_tokens)
        else:
            outcome = self._came_late(pk, seq, "result")
        if self.on_item:
            self.on_item(outcome, seq)

    def _came_late(self, pk: int, seq: int, what: str) -> str | None:
        """A result or failure that found the item settled (or handed to another worker)
        meanwhile: counted and logged, never an error for the chunk's other items. Returns
        the item's status now."""
        status = retrying(self.session, lambda: self._item_status(pk), "reading an item")
        if status == "done":  # another delivery stored it first: the usual duplicate
            self.report.duplicates += 1
        else:
            self.report.late += 1
            log.warning("job %s item %d: its %s came when the item was %s; not recorded",
                        self.job_id, seq, what, status)
        return status

    def _item_status(self, pk: int) -> str | None:
        status = repo.item_status(self.session, pk)
        self.session.commit()  # ends the read: no transaction stays open while items decode
        return status

"""Heartbeat and reaper thread of each process that runs tasks.

One heartbeat row per process in Postgres (`semjobs.db.models.Worker`), not a Redis key with a
TTL: the reaper must decide "this worker is dead" and take its items in one transaction
(row locks), the items that record their worker already live there, and the database's
clock is the one clock every host shares.

The process's name, "node@host:pid", is what its tasks store in items.worker. It is set
where tasks run: in each prefork child (worker_process_init), in the solo pool's process
(the same signal) and in the main process of the threads pool (worker_ready); never in a
prefork parent, which runs no task and must not fork with threads running.
"""

from __future__ import annotations

import os
import threading
import time

from celery.signals import worker_process_init, worker_ready
from celery.utils.log import get_logger

from semjobs.db import repo
from semjobs.db.retry import one_line
from semjobs.db.session import session_factory
from semjobs.settings import settings
from semjobs.worker.holdings import holdings
from semjobs.worker.orphans import LostChunks, requeue_lost
from semjobs.worker.recovery import hand_back_unworked, recover

log = get_logger(__name__)
_name: str | None = None
_lost_chunks = LostChunks()


def name() -> str | None:
    """This process's worker name, once it beats; None outside a worker."""
    return _name


def start(worker: str) -> None:
    """Beat once now (so no item is claimed under a name without a row), then keep beating
    and reaping from a daemon thread, which dies with the process."""
    global _name
    if _name is not None:
        return
    _name = worker
    try:
        with session_factory()() as session:
            repo.beat(session, worker)
    except Exception as e:  # database down: the thread keeps trying
        log.warning("heartbeat of %s failed, retrying: %s", worker, one_line(e))
    threading.Thread(target=_run, name="semjobs-liveness", daemon=True).start()


def tick(reap: bool = True) -> None:
    """One beat; the items the database says this process holds but it no longer works on
    go back out (semjobs.worker.holdings); with `reap`, one reaper pass over the other workers;
    then a look for chunks the broker lost (semjobs.worker.orphans)."""
    with session_factory()() as session:
        repo.beat(session, _name)
    handed = hand_back_unworked(_name, holdings.keys)
    if handed:
        log.warning("%s held items it no longer works on (a chunk that ended unsettled, or an earlier "
                    "process of the same name): re-enqueued %s", _name, handed)
    released = recover(me=_name) if reap else repo.Released()
    if released.items or released.questions:
        log.warning("dead workers %s: re-enqueued their items %s and calibration questions %s",
                    ", ".join(released.workers), released.items, released.questions)
    elif released.workers:
        log.info("removed the heartbeats of stopped workers %s", ", ".join(released.workers))
    try:  # a broker problem must not hold back the beat itself
        lost = requeue_lost(_lost_chunks)
    except Exception as e:
        if not _lost_chunks.failing:
            log.warning("looking for chunks the broker lost failed, trying again each beat: %s", one_line(e))
        _lost_chunks.failing = True
        return
    _lost_chunks.failing = False
    if lost:
        log.warning("the broker had lost the messages of pending items %s: re-enqueued them", lost)


def _run() -> None:
    failures = 0
    # During and after an outage every heartbeat looks old: reap nobody until the others
    # have had the dead-after time to beat again.
    reap_after = 0.0
    while True:
        try:
            tick(reap=time.monotonic() >= reap_after)
            if failures:
                log.warning("heartbeat of %s: the database and broker answer again", _name)
            failures = 0
        except Exception as e:  # a database or broker outage must not end the beats
            reap_after = time.monotonic() + settings.worker_dead_after_s
            failures += 1
            if failures == 1:  # one line for the outage, not a traceback per attempt
                log.warning("heartbeat of %s failed, retrying with back-off: %s", _name, one_line(e))
        time.sleep(retry_delay(failures))


def retry_delay(failures: int) -> float:
    """Seconds to the next beat: the interval, doubled per failure in a row, but never past a
    third of the dead-after time, so that a worker waiting out an outage is not taken for dead
    by the others the moment the database is back."""
    return min(settings.heartbeat_interval_s * 2 ** failures,
               max(settings.heartbeat_interval_s, settings.worker_dead_after_s / 3))


@worker_process_init.connect
def _on_process_init(sender=None, **_kwargs) -> None:
    # sender is the node name ("w1@host"), the same as the task requests' hostname.
    start(f"{sender}:{os.getpid()}")


@worker_ready.connect
def _on_ready(sender=None, **_kwargs) -> None:
    from celery.concurrency.prefork import TaskPool as PreforkPool

    if not isinstance(sender.pool, PreforkPool):  # solo: already started; threads: start
        start(f"{sender.hostname}:{os.getpid()}")

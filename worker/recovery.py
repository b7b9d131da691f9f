"""The reaper: re-enqueue the items held by workers that stopped beating.

A whole worker lost (SIGKILL, a preempted GPU node) cannot reject its task, so Redis hands
its chunk out again only after the visibility timeout (hours). Instead every live worker
runs `recover` on each heartbeat (`semjobs.worker.liveness`), and operators can run it by hand
(`semjobs recover`): the dead worker's items go back to pending and out as new tasks. The
late redelivery of the original chunk then finds them done (or claims them like any
redelivery): outputs stay one per item.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager

from semjobs.db import repo
from semjobs.db.models import Calibration
from semjobs.db.session import session_factory
from semjobs.jobs.submit import send_chunks
from semjobs.settings import settings
from semjobs.worker import publish

Publisher = Callable[[str], AbstractContextManager[Callable[[str, list[int], list[str]], None]]]


def recover(url: str | None = None, dead_after_s: float | None = None,
            publisher: Publisher | None = None, me: str | None = None,
            question_publisher: Publisher | None = None) -> repo.Released:
    """Release the items of dead workers and enqueue them on their jobs' queues, in chunks.
    The release commits only after the messages are published: if publishing fails, the
    items stay held by the dead worker and the next run tries again.

    `me`, the caller's worker name: its sibling processes (the same node, so the same host
    and process namespace: prefork children) whose process is gone are dead at once, without
    waiting for their heartbeat to age."""
    if publisher is None:
        publisher = publish.publisher
    if dead_after_s is None:
        dead_after_s = settings.worker_dead_after_s
    with session_factory(url)() as session:
        gone = gone_siblings(repo.worker_names(session, me.rpartition(":")[0] + ":")) if me else []
        released = repo.release_dead_workers(session, dead_after_s, gone)
        _enqueue(session, released.items, publisher)
        _enqueue_questions(session, released.questions, question_publisher or publish.calibration_publisher)
        session.commit()
    return released


def _enqueue_questions(session, questions: dict[str, list[str]], publisher: Publisher) -> None:
    """Send the released calibration questions to their calibration's queue, one each."""
    for cal_id, qids in questions.items():
        with publisher(session.get(Calibration, cal_id).queue) as send:
            for qid in qids:
                send(cal_id, qid)


def hand_back_unworked(me: str, working: Callable[[], set[tuple[str, int]]], url: str | None = None,
                       publisher: Publisher | None = None) -> dict[str, list[int]]:
    """Release and enqueue the items the database says `me` holds but this process no
    longer works on (`working()`, semjobs.worker.holdings): no other worker would take them from a
    worker that beats. The database is read first, then `working()`: a chunk records what
    it holds in the process before the database does, so a chunk starting in between is
    seen working."""
    with session_factory(url)() as session:
        held = repo.held_by(session, me)
        if not held:
            return {}
        now_working = working()
        released = repo.release_held(session, me, [k for k in held if k not in now_working])
        _enqueue(session, released, publisher or publish.publisher)
        session.commit()
    return released


def _enqueue(session, items: dict[str, list[int]], publisher: Publisher) -> None:
    """Send the released items of each job to its queue, in chunks."""
    by_queue: dict[str, list[str]] = {}
    for job_id in items:
        by_queue.setdefault(repo.get_job(session, job_id).queue, []).append(job_id)
    for queue, job_ids in by_queue.items():
        with publisher(queue) as send:
            for job_id in job_ids:
                send_chunks(session, job_id, items[job_id], send)


def gone_siblings(names: list[str]) -> list[str]:
    """Those of `names` ("node@host:pid", one node's processes) whose process has ended."""
    gone = []
    for name in names:
        pid = name.rpartition(":")[2]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            gone.append(name)
        except PermissionError:  # alive, someone else's
            pass
    return gone

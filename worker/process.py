"""The per-item code: claim -> engine -> commit, one item at a time.

The Celery task (`worker.tasks.run_chunk`) and the embedded mode (`semjobs run`) both call
`run_items`; nothing here imports Celery. Every item is claimed and committed on its own, so
a crash loses at most the item in flight, and a redelivered chunk skips what is done.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from db import repo
from db.session import session_factory
from jobs.submit import item_config
from semjobs.settings import settings
from worker import engine as engines

_job_configs: dict[str, dict] = {}  # job id -> config (immutable once stored)
_identities_written: set[str] = set()


@dataclass
class ChunkReport:
    done: int = 0
    failed: int = 0
    skipped: int = 0  # already finished, or claimed by nobody (cancelled)
    duplicates: int = 0  # finished here, but another delivery had stored it first
    cancelled: bool = False
    left: list[int] = field(default_factory=list)  # not attempted: the chunk ran out of time


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _job_config(session, job_id: str) -> dict | None:
    cfg = _job_configs.get(job_id)
    if cfg is None:
        job = repo.get_job(session, job_id)
        if job is None:
            return None
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
) -> ChunkReport:
    """Process the items `seqs` of job `job_id`. `deadline` (time.monotonic) stops before an
    item that would start after it, and so does `should_stop()` returning true (a worker
    shutting down); the rest is returned in `report.left`."""
    report = ChunkReport()
    worker = worker or worker_name()
    with session_factory(url, role="worker")() as session:
        config = _job_config(session, job_id)
        if config is None:
            report.skipped = len(seqs)
            return report
        # Load first (minutes, once per process), so no transaction stays open meanwhile.
        engine = engines.get_engine()  # raises EngineLoadError
        defer_commit = session.get_bind().dialect.name == "postgresql"
        if job_id not in _identities_written:
            repo.mark_job_running(session, job_id, engines.identities(engine))
            _identities_written.add(job_id)
        else:  # committed together with the first claim
            repo.mark_job_running(session, job_id, commit=not defer_commit)
        repo.hold_items(session, job_id, seqs, worker)  # committed with the first claim
        for i, seq in enumerate(seqs):
            if i > 0 and ((deadline is not None and time.monotonic() > deadline)
                          or (should_stop is not None and should_stop())):
                report.left = list(seqs[i:])
                repo.release_items(session, job_id, report.left, worker)  # the caller requeues
                break
            claim = repo.claim_item(session, job_id, seq, worker)
            if claim is None:
                if repo.job_is_cancelled(session, job_id):
                    repo.cancel_leftovers(session, job_id, seqs[i:])
                    report.cancelled = True
                    break
                report.skipped += 1
                continue
            if claim.attempts > settings.max_attempts:
                repo.fail_item(
                    session, claim.pk,
                    f"gave up after {claim.attempts - 1} deliveries that never finished "
                    f"(max_attempts={settings.max_attempts}; was the worker killed?)",
                )
                report.failed += 1
                continue
            try:
                result = engines.generate(engine, claim.request, item_config(config, claim.request))
            except Exception as e:  # the engine failed on this item: record it, go on
                tail = "".join(traceback.format_exception_only(type(e), e)).strip()
                repo.fail_item(session, claim.pk, tail)
                report.failed += 1
                if on_item:
                    on_item("failed", seq)
                continue
            # Postgres: committed by the next claim's commit or by finalize_job's durable one
            # (one round trip less per item). SQLite locks the whole file: commit now.
            if repo.save_result(session, job_id, claim.pk, result, commit=not defer_commit):
                report.done += 1
            else:
                report.duplicates += 1
            if on_item:
                on_item("done", seq)
        repo.finalize_job(session, job_id)
    return report

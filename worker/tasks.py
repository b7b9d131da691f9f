"""Thin Celery tasks: a chunk of item positions -> the shared per-item code."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from celery.utils.log import get_task_logger
from sqlalchemy.exc import OperationalError

from semjobs.settings import settings
from worker.celery import app
from worker.engine import EngineLoadError
from worker.process import run_items, worker_name
from worker.queues import queue_name

log = get_task_logger(__name__)


@app.task(
    name="semjobs.run_chunk",
    bind=True,
    autoretry_for=(EngineLoadError, OperationalError),
    retry_backoff=5,
    retry_backoff_max=300,
    max_retries=10,
)
def run_chunk(self, job_id: str, seqs: list[int]) -> dict:
    # Stop starting new items after half the visibility timeout: a task must end well
    # before Redis would hand its message to a second worker.
    deadline = time.monotonic() + settings.visibility_timeout_s / 2
    hostname = f"{self.request.hostname}:{os.getpid()}" if self.request.hostname else worker_name()
    report = run_items(job_id, seqs, worker=hostname, deadline=deadline)
    if report.left:
        queue = (self.request.delivery_info or {}).get("routing_key") or queue_name()
        run_chunk.apply_async((job_id, report.left), queue=queue)
    log.info(
        "job %s chunk %s: done=%d failed=%d skipped=%d duplicates=%d%s",
        job_id, seqs[:1], report.done, report.failed, report.skipped, report.duplicates,
        " cancelled" if report.cancelled else "",
    )
    return {"done": report.done, "failed": report.failed}


@contextmanager
def publisher(queue: str) -> Iterator[Callable[[str, list[int]], None]]:
    """An `enqueue(job_id, seqs)` callable for `jobs.submit.enqueue_job` that publishes on
    one held broker connection."""
    with app.producer_or_acquire() as producer:

        def send(job_id: str, seqs: list[int]) -> None:
            run_chunk.apply_async((job_id, seqs), queue=queue, producer=producer)

        yield send

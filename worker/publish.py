"""Publishing chunk messages for the workers, without importing the task code: submit,
retry and the dead-worker reaper (`worker.recovery`, run from the heartbeat thread of
`worker.liveness`) only need the task's name and the broker."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from celery.utils import uuid

from worker.celery import app

RUN_CHUNK = "semjobs.run_chunk"  # the task (worker.tasks.run_chunk) each message asks for


@contextmanager
def publisher(queue: str) -> Iterator[Callable[[str, list[int]], None]]:
    """An `enqueue(job_id, seqs)` callable for `jobs.submit.enqueue_job`.

    It builds the `run_chunk` task messages itself (Celery protocol 2, `as_task_v2`) and
    publishes them straight to the queue on one held connection in pipelined batches: about
    0.15 ms a message instead of ~0.5 ms through `apply_async`, which is what lets a
    50,000-item submit (12,500 messages) finish in seconds. Leaving the block flushes the
    rest; an exception discards what was not flushed yet.
    """
    amqp = app.amqp
    with app.producer_or_acquire() as producer, producer.batch(max_size=1000):

        def send(job_id: str, seqs: list[int]) -> None:
            message = amqp.as_task_v2(
                uuid(), RUN_CHUNK, args=(job_id, seqs), kwargs={}, ignore_result=True,
                argsrepr=f"({job_id!r}, [{seqs[0]}..{seqs[-1]}] {len(seqs)} items)",
                kwargsrepr="{}",
            )
            producer.publish(
                message.body, exchange="", routing_key=queue, serializer="json",
                headers=message.headers, retry=True, **message.properties,
            )

        yield send

"""The Celery app, configured for long GPU tasks (README: "Workers that die").

- late acks + prefetch 1: a task is acknowledged after it ran, one reserved at a time;
- reject_on_worker_lost: a task whose process died is requeued (the attempt cap is kept per
  item in the database, see `semjobs.db.repo.claim_item`);
- one visibility timeout for broker and result backend; each task stops starting new items
  after half of it and hands the rest to a new task, so no task outlives it;
- task events on (Flower), one queue per model pair (`semjobs.worker.queues.queue_name`).
Importing this module loads no model: the engine is loaded lazily in the process that runs
tasks (`semjobs.worker.engine.get_engine`).
"""

from __future__ import annotations

from celery import Celery

from semjobs.settings import Settings, settings
from semjobs.worker.queues import queue_name


def make_app(s: Settings = settings) -> Celery:
    app = Celery("semjobs", broker=s.redis_url, backend=s.redis_url, include=["semjobs.worker.tasks"])
    vt = s.visibility_timeout_s
    transport = {
        "visibility_timeout": vt,
        # Sweep for messages of dead workers every vt/4 (1 s..60 s) instead of kombu's
        # default ~100 s, so a lost chunk is redelivered within ~1.25 x the timeout.
        "unacked_restore_interval": max(1, min(60, vt // 4)),
        "unacked_restore_throttle": 1,
    }
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport,
        result_backend_transport_options=dict(transport),
        task_ignore_result=True,  # results live in the database
        task_default_queue=queue_name(s),
        task_create_missing_queues=True,
        worker_send_task_events=True,
        task_send_sent_event=False,  # halves the cost of a 50,000-item submit; Flower
        # still sees every task from "received" on (worker events).
        task_track_started=True,
        task_serializer="json",
        accept_content=["json"],
        # Loading is lazy, but a child that imports torch may still need more than 4 s.
        worker_proc_alive_timeout=120,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app


app = make_app()

"""Items whose chunk the broker lost: re-enqueued, so a job never waits for messages that
no longer exist.

A Redis that keeps nothing on disk loses every queued message when it restarts; Postgres
still has the items, pending and held by no worker, and no worker will ever be handed
them. Each heartbeat (`semjobs.worker.liveness`) looks at the queues of active jobs that have such
items: a queue with no message, waiting (its lists) or delivered (kombu's `unacked` hash,
where a message stays from its delivery until its task is acknowledged), has lost them.
Items seen so on two beats in a row (a message between Redis's list and the unacked hash,
for the instant of its delivery, is seen in neither) are enqueued again, by one process at a
time (a Postgres advisory lock). Each time counts as a delivery: an item lost more often
than `max_attempts` (say, a chunk that fails before it starts, every time) ends failed. A
false alarm costs repeated work, never a second output: outputs are keyed by item.

A job still `pending` was stored but never enqueued: its submit died between the commit and
the enqueue, or met a broker that was down (`semjobs submit` then exits 1 saying so). Its
items are enqueued the same way once the job has been seen so for `settings.pending_grace_s`
(a submit that is enqueueing a large job right now is not raced), without counting a
delivery: none was made.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from semjobs.db import repo
from semjobs.db.session import session_factory
from semjobs.settings import settings
from semjobs.worker.queues import EMBEDDED_QUEUE

UNACKED_KEY = "unacked"  # kombu's Redis transport: delivery tag -> [message, exchange, routing key]
PRIORITY_SEPARATOR = "\x06\x16"  # kombu's separator between a queue's name and a priority step
PRIORITY_STEPS = (3, 6, 9)  # kombu's default steps besides 0 (whose list is the bare name)
LOCK_KEY = 0x53_454D_4A4F  # pg advisory lock: one process re-enqueues at a time


def redis_queue_state(client, queues: list[str]) -> Callable[[str], bool]:
    """Whether Redis holds any message of each queue, waiting or delivered. The lists are
    read before the unacked hash: a message moving from one to the other in between is seen."""
    pipe = client.pipeline(transaction=True)
    for q in queues:
        for key in [q, *(f"{q}{PRIORITY_SEPARATOR}{p}" for p in PRIORITY_STEPS)]:
            pipe.llen(key)
    pipe.hvals(UNACKED_KEY)
    *lengths, unacked = pipe.execute()
    per_queue = 1 + len(PRIORITY_STEPS)
    waiting = {q for i, q in enumerate(queues) if any(lengths[i * per_queue:(i + 1) * per_queue])}
    delivered = {json.loads(raw)[2] for raw in unacked}
    return lambda q: q in waiting or q in delivered


class LostChunks:
    """Finds items of lost chunks and of jobs never enqueued; remembers the last beat's
    candidates (one per process)."""

    def __init__(self):
        self.candidates: dict[str, set[int]] = {}
        # pending job id -> when this process first saw it with no message (time.monotonic())
        self.unsent_since: dict[str, float] = {}
        self.failing = False  # the last look raised (logged once, not every beat)

    def check(self, session, client) -> dict[str, list[int]]:
        """Job id -> positions seen lost on this beat and the one before (for a job still
        pending: seen so for the grace period too)."""
        rows = [r for r in repo.jobs_with_unheld_pending(session) if r[1] != EMBEDDED_QUEUE]
        seen: dict[str, set[int]] = {}
        if rows:
            has_messages = redis_queue_state(client, sorted({q for _, q, _ in rows}))
            for job_id, queue, _status in rows:
                if not has_messages(queue):
                    seen[job_id] = set(repo.unheld_pending_seqs(session, job_id))
        now = time.monotonic()
        unsent = [j for j, _, status in rows if status == "pending" and j in seen]
        self.unsent_since = {j: self.unsent_since.get(j, now) for j in unsent}
        waiting = {j for j in unsent if now - self.unsent_since[j] < settings.pending_grace_s}
        lost = {j: sorted(s & self.candidates.get(j, set())) for j, s in seen.items() if j not in waiting}
        self.candidates = seen
        return {j: s for j, s in lost.items() if s}


_client = None


def _redis():
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(settings.redis_url)
    return _client


def requeue_lost(lost_chunks: LostChunks, url: str | None = None, client=None, publisher=None) -> dict[str, list[int]]:
    """One look (a heartbeat's); enqueue again what was seen lost twice, and what was never
    enqueued. Returns it."""
    from semjobs.jobs.submit import enqueue_job
    from semjobs.worker.publish import publisher as default_publisher

    with session_factory(url)() as session:
        if not repo.try_lock(session, LOCK_KEY):  # another process is at it this instant
            return {}
        lost = lost_chunks.check(session, client or _redis())
        jobs = {job_id: repo.get_job(session, job_id) for job_id in lost}
        again = {job_id: seqs if jobs[job_id].status == "pending"  # never sent: no delivery to count
                 else repo.count_lost_delivery(session, job_id, seqs, settings.max_attempts)
                 for job_id, seqs in lost.items()}
        queues = {job_id: job.queue for job_id, job in jobs.items()}
        session.commit()  # the deliveries counted, the lock released
        for job_id, seqs in again.items():
            if seqs:
                with (publisher or default_publisher)(queues[job_id]) as send:
                    enqueue_job(job_id, send, url=url, seqs=seqs)
            else:  # every lost item failed: the job may be complete now
                repo.finalize_job(session, job_id)
    return lost

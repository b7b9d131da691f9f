"""Items whose chunk the broker lost: re-enqueued, so a job never waits for messages that
no longer exist.

A Redis that keeps nothing on disk loses every queued message when it restarts; Postgres
still has the items, pending and held by no worker, and no worker will ever be handed
them. Each heartbeat (`worker.liveness`) looks for such items of active jobs whose queue
holds no message, waiting or delivered (kombu's `unacked` hash, where a message stays from
its delivery until its task is acknowledged). Seen so on two beats in a row (a message
between Redis's list and the unacked hash, for the instant of its delivery, is seen
neither), they are enqueued again. A false alarm costs repeated work, never a second output:
outputs are keyed by item (README: "Workers that die").
"""

from __future__ import annotations

import json
from collections.abc import Callable

from db import repo
from db.session import session_factory
from semjobs.settings import settings

UNACKED_KEY = "unacked"  # kombu's Redis transport: delivery tag -> [message, exchange, routing key]
PRIORITY_SEPARATOR = "\x06\x16"  # kombu's separator between a queue's name and a priority step


def redis_queue_state(client) -> Callable[[str], bool]:
    """A function telling whether Redis holds any message of a queue, waiting or delivered."""
    delivered = {json.loads(raw)[2] for raw in client.hvals(UNACKED_KEY)}

    def has_messages(queue: str) -> bool:
        if queue in delivered:
            return True
        keys = [queue] + [k.decode() for k in client.scan_iter(f"{queue}{PRIORITY_SEPARATOR}*")]
        return any(client.llen(k) for k in keys)

    return has_messages


class LostChunks:
    """Finds items of lost chunks; remembers the last beat's candidates (one per process)."""

    def __init__(self):
        self.candidates: dict[str, set[int]] = {}

    def check(self, session, has_messages: Callable[[str], bool]) -> dict[str, list[int]]:
        """Job id -> positions seen lost on this beat and the one before."""
        seen: dict[str, set[int]] = {}
        for job_id, queue, seqs in repo.unheld_pending(session):
            if not has_messages(queue):
                seen[job_id] = set(seqs)
        lost = {j: sorted(s & self.candidates.get(j, set())) for j, s in seen.items()}
        self.candidates = seen
        return {j: s for j, s in lost.items() if s}


def requeue_lost(lost_chunks: LostChunks, url: str | None = None, client=None, publisher=None) -> dict[str, list[int]]:
    """One look (a heartbeat's); enqueue again what was seen lost twice. Returns it."""
    import redis

    from worker.publish import publisher as default_publisher

    client = client or redis.Redis.from_url(settings.redis_url)
    with session_factory(url)() as session:
        lost = lost_chunks.check(session, redis_queue_state(client))
        if lost:
            from jobs.submit import enqueue_job

            for job_id, seqs in lost.items():
                with (publisher or default_publisher)(repo.get_job(session, job_id).queue) as send:
                    enqueue_job(job_id, send, url=url, seqs=seqs)
    return lost

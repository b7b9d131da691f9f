"""Riding out a database outage (a Postgres restart, a failover) inside a running chunk.

Items in flight keep decoding while the database is away; their results are held in memory
and committed once it answers again, so an outage of seconds or minutes costs no work. Only
an outage longer than `settings.database_retry_s` ends the chunk (its task then retries,
and the heartbeat hands back what it held: semjobs.worker.holdings).

A connection lost after the server committed but before it answered makes the work run
twice: a claim then counts one attempt more, a result is reported as a duplicate (the
output is stored once either way).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from semjobs.settings import settings

T = TypeVar("T")
log = logging.getLogger(__name__)


def one_line(e: BaseException) -> str:
    """An exception as one log line: its type and its first line (no traceback)."""
    text = str(getattr(e, "orig", None) or e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def retrying(session: Session, work: Callable[[], T], what: str) -> T:
    """Run `work` (database statements that end with their own commit); on a lost
    connection roll back and run it again, with back-off from 0.5 s to 10 s, for up to
    `settings.database_retry_s`. One warning when the outage starts, one when it ends."""
    give_up = time.monotonic() + settings.database_retry_s
    delay, failures = 0.5, 0
    while True:
        try:
            value = work()
            if failures:
                log.warning("database answers again after %d retries (%s)", failures, what)
            return value
        except OperationalError as e:
            session.rollback()
            if time.monotonic() + delay > give_up:
                raise
            if failures == 0:
                log.warning("database unreachable while %s, retrying with back-off: %s", what, one_line(e))
            failures += 1
            time.sleep(delay)
            delay = min(2 * delay, 10.0)

"""Engines and sessions, one engine per database URL per process.

The URL comes from the settings object unless a caller passes one (the embedded mode uses
its SQLite file). Engines are created lazily, so importing this module connects to nothing,
and a forked Celery child gets its own pool (`dispose_all` after fork).
"""

from __future__ import annotations

import os

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from semjobs.settings import settings

_engines: dict[tuple[str, str], Engine] = {}
_factories: dict[tuple[str, str], sessionmaker[Session]] = {}

# Roles: "default" for everything; "worker" for the per-item writes. On Postgres the worker's
# connections commit asynchronously (synchronous_commit=off): each item's commit is visible at
# once, and `semjobs.db.repo.finalize_chunk` ends every chunk with one synchronous commit, which
# flushes the WAL of all earlier commits, before Celery acknowledges the task. A Postgres
# crash can so only lose items of an unacknowledged chunk, which is redelivered and redone.
ROLES = ("default", "worker")


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def get_engine(url: str | None = None, role: str = "default") -> Engine:
    url = url or settings.database_url
    engine = _engines.get((url, role))
    if engine is None:
        if url.startswith("sqlite"):
            engine = create_engine(url, connect_args={"timeout": 30})
            event.listen(engine, "connect", _sqlite_pragmas)
        elif role == "worker":
            # No pre-ping on every checkout (two round trips per item saved); a dropped
            # connection raises OperationalError and the task retries.
            engine = create_engine(
                url, pool_recycle=1800,
                connect_args={"options": "-c synchronous_commit=off"},
            )
        else:
            engine = create_engine(url, pool_pre_ping=True)
        _engines[(url, role)] = engine
    return engine


def session_factory(url: str | None = None, role: str = "default") -> sessionmaker[Session]:
    url = url or settings.database_url
    factory = _factories.get((url, role))
    if factory is None:
        factory = sessionmaker(get_engine(url, role), expire_on_commit=False)
        _factories[(url, role)] = factory
    return factory


def forget(url: str) -> None:
    """Dispose of and drop the engines for `url` (tests drop their databases)."""
    for role in ROLES:
        engine = _engines.pop((url, role), None)
        if engine is not None:
            engine.dispose()
        _factories.pop((url, role), None)


def dispose_all() -> None:
    """Drop pooled connections inherited across fork (call in the child)."""
    for engine in _engines.values():
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=dispose_all)

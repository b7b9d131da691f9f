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

_engines: dict[str, Engine] = {}
_factories: dict[str, sessionmaker[Session]] = {}


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def get_engine(url: str | None = None) -> Engine:
    url = url or settings.database_url
    engine = _engines.get(url)
    if engine is None:
        if url.startswith("sqlite"):
            engine = create_engine(url, connect_args={"timeout": 30})
            event.listen(engine, "connect", _sqlite_pragmas)
        else:
            engine = create_engine(url, pool_pre_ping=True)
        _engines[url] = engine
    return engine


def session_factory(url: str | None = None) -> sessionmaker[Session]:
    url = url or settings.database_url
    factory = _factories.get(url)
    if factory is None:
        factory = sessionmaker(get_engine(url), expire_on_commit=False)
        _factories[url] = factory
    return factory


def dispose_all() -> None:
    """Drop pooled connections inherited across fork (call in the child)."""
    for engine in _engines.values():
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=dispose_all)

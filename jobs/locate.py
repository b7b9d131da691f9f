"""Which database, and which job, a command means when the user does not say.

The database: `--db` when given; else `SEMJOBS_DATABASE_URL` when it is set (the full stack:
Postgres); else the database of the last `semjobs run` or `submit` on this machine (recorded in
`settings.last_run_file`); else the embedded SQLite file. The job: the one named, else the
newest job in that database. So after `semjobs run`, `semjobs status`, `jobs`, `export` and
`report` find that job with no flags.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sqlalchemy.engine import make_url

from semjobs.db import repo
from semjobs.db.session import session_factory
from semjobs.settings import settings

LAST_RUN_FILE = "last_run.json"


def _last_run_path() -> Path:
    return Path(settings.last_run_file or Path(settings.cache_dir) / LAST_RUN_FILE)


def _sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names; None for other databases and in-memory SQLite."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        return Path(u.database)
    return None


def remember(job_id: str, url: str) -> None:
    """Record the job a command just stored and its database (a relative SQLite path made
    absolute, so the record holds from any directory)."""
    file = _sqlite_file(url)
    if file is not None:
        url = make_url(url).set(database=str(file.resolve())).render_as_string(hide_password=False)
    path = _last_run_path()
    try:  # a convenience: a cache that cannot be written must not fail the job
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the URL may hold a password
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"job": job_id, "database": url}) + "\n")
    except OSError:
        pass


def _configured() -> bool:
    """Whether the deployment names its database (the environment, a .env file, code)."""
    default = type(settings).model_fields["database_url"].default
    return "SEMJOBS_DATABASE_URL" in os.environ or settings.database_url != default


def database_url(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    if _configured():
        return settings.database_url
    try:
        return json.loads(_last_run_path().read_text())["database"]
    except (OSError, ValueError, KeyError):
        return settings.embedded_database_url


def missing_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL when it does not exist (opening it would create it empty)."""
    file = _sqlite_file(url)
    return file if file is not None and not file.exists() else None


def newest_job(url: str) -> str | None:
    with session_factory(url)() as session:
        jobs = repo.list_jobs(session, 1)
    return jobs[0].id if jobs else None

"""Which database, and which job, a command means when the user does not say.

The database: `--db` when given; else `SEMJOBS_DATABASE_URL` when it is set (the full stack:
Postgres); else the database of the last `semjobs run` or `submit` on this machine (recorded in
`settings.last_run_file`); else the embedded SQLite file. The job: the one named, else the
newest job in that database. So after `semjobs run`, `semjobs status`, `jobs`, `export` and
`report` find that job with no flags. The record holds no password: a database that needs
one is named again with `--db` or `SEMJOBS_DATABASE_URL`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from semjobs.db import repo
from semjobs.db.session import session_factory
from semjobs.settings import settings

LAST_RUN_FILE = "last_run.json"
# libpq reads a password from the URL's query too (postgresql://u@h/db?password=...)
SECRET_QUERY_KEYS = ("password", "sslpassword")


def _last_run_path() -> Path:
    return Path(settings.last_run_file or Path(settings.cache_dir) / LAST_RUN_FILE)


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names; None for other databases and in-memory SQLite."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        return Path(u.database)
    return None


def has_secret(url: str | URL) -> bool:
    """Whether a database URL carries a password, its own or a query parameter's."""
    u = make_url(url)
    return u.password is not None or any(key.lower() in SECRET_QUERY_KEYS for key in u.query)


def without_secrets(url: str | URL) -> URL:
    """A database URL without its password, nor one given as a query parameter."""
    u = make_url(url)
    query = {key: value for key, value in u.query.items() if key.lower() not in SECRET_QUERY_KEYS}
    # URL.set() leaves a field given None as it was: the URL is built again without it
    return URL.create(u.drivername, u.username, None, u.host, u.port, u.database, query)


def shown_url(url: str | URL) -> str:
    """A database URL as a screen or a log may show it: any password as ***."""
    u = make_url(url)
    shown = without_secrets(u)
    if has_secret(u):  # rendered hidden: as *** where a password goes
        shown = shown.set(password="hidden")
    return shown.render_as_string(hide_password=True)


class PasswordNotStored(ValueError):
    """The last run's database needs a password, which its record does not keep."""


def remember(job_id: str, url: str) -> None:
    """Record the job a command just stored and its database (a relative SQLite path made
    absolute, so the record holds from any directory), without its password: only whether
    it had one, so a later command asks for it instead of failing to log in."""
    u = make_url(url)
    file = sqlite_file(url)
    if file is not None:
        u = u.set(database=str(file.resolve()))
    record = {"job": job_id, "database": without_secrets(u).render_as_string(hide_password=False)}
    if has_secret(u):
        record["password"] = "not stored"
    path = _last_run_path()
    try:  # a convenience: a cache that cannot be written must not fail the job
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the user's own, like ~/.pgpass
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record) + "\n")
    except OSError:
        pass


def _configured() -> bool:
    """Whether the deployment names its database (the environment, SEMJOBS_ENV_FILE, code)."""
    default = type(settings).model_fields["database_url"].default
    return "SEMJOBS_DATABASE_URL" in os.environ or settings.database_url != default


def database_url(explicit: str | None = None) -> str:
    """Raises PasswordNotStored when it would be the last run's and that needs a password (a
    configured database, which carries its own, is used before the record is read)."""
    if explicit:
        return explicit
    if _configured():
        return settings.database_url
    try:
        record = json.loads(_last_run_path().read_text())
        url = record["database"]
    except (OSError, ValueError, KeyError):
        return settings.embedded_database_url
    if "password" in record:
        raise PasswordNotStored(f"the last run's database {url} needs a password, which semjobs does "
                                "not store: give --db with the full URL or set SEMJOBS_DATABASE_URL")
    return url


def missing_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL when it does not exist (opening it would create it empty)."""
    file = sqlite_file(url)
    return file if file is not None and not file.exists() else None


def newest_job(url: str) -> str | None:
    with session_factory(url)() as session:
        jobs = repo.list_jobs(session, 1)
    return jobs[0].id if jobs else None

"""Run the Alembic migrations from code (`semjobs db upgrade`, the embedded mode, tests).

The script location is the installed `semjobs.migrations` package, so this works without the
repository's alembic.ini (which exists for the plain `alembic` command).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from semjobs import migrations
from semjobs.settings import settings


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    # __path__, not __file__: an editable install may expose the package as a namespace.
    cfg.set_main_option("script_location", str(Path(next(iter(migrations.__path__)))))
    cfg.attributes["url"] = url or settings.database_url
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str | None, revision: str) -> None:
    """Roll back to `revision`: no default, since `base` drops every table and its data."""
    command.downgrade(alembic_config(url), revision)


def current(url: str | None = None) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine, pool

    engine = create_engine(url or settings.database_url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        rev = MigrationContext.configure(conn).get_current_revision()
    engine.dispose()
    return rev

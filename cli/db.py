"""`semjobs db ...`: schema management through the Alembic migrations."""

import click


@click.group()
def db() -> None:
    """Database schema (Alembic migrations)."""


@db.command()
@click.option("--url", default=None, help="Database URL (default: SEMJOBS_DATABASE_URL).")
@click.option("--revision", default="head", show_default=True)
def upgrade(url: str | None, revision: str) -> None:
    """Create or update the schema.

    Example: semjobs db upgrade --url postgresql+psycopg://postgres@127.0.0.1:5432/semjobs"""
    from semjobs.db import migrate

    migrate.upgrade(url, revision)
    click.echo(f"database at revision {migrate.current(url)}")


@db.command()
@click.option("--url", default=None, help="Database URL (default: SEMJOBS_DATABASE_URL).")
@click.option("--revision", default="base", show_default=True)
def downgrade(url: str | None, revision: str) -> None:
    """Roll the schema back (default: drop everything).

    Example: semjobs db downgrade --revision 0003_worker_heartbeats"""
    from semjobs.db import migrate

    migrate.downgrade(url, revision)
    click.echo(f"database at revision {migrate.current(url)}")


@db.command()
@click.option("--url", default=None, help="Database URL (default: SEMJOBS_DATABASE_URL).")
def current(url: str | None) -> None:
    """Print the schema revision.

    Example: semjobs db current --url sqlite:///out/semjobs.sqlite"""
    from semjobs.db import migrate

    click.echo(migrate.current(url) or "(empty)")

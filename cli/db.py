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
@click.option("--revision", required=True,
              help="The revision to roll back to; `base` drops every table and all their data.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def downgrade(url: str | None, revision: str, yes: bool) -> None:
    """Roll the schema back to --revision, dropping what later revisions added, data included.
    Asks first, unless --yes.

    Example: semjobs db downgrade --revision 0003_worker_heartbeats"""
    from semjobs.db import migrate
    from semjobs.jobs.locate import shown_url
    from semjobs.settings import settings

    if not yes:
        shown = shown_url(url or settings.database_url)
        what = "drop every table and all data" if revision == "base" else \
            "drop the tables and columns added after it, with their data"
        click.confirm(f"Roll the schema of {shown} back from {migrate.current(url)} to {revision}? "
                      f"This will {what}.", abort=True)
    migrate.downgrade(url, revision)
    click.echo(f"database at revision {migrate.current(url)}")


@db.command()
@click.option("--url", default=None, help="Database URL (default: SEMJOBS_DATABASE_URL).")
def current(url: str | None) -> None:
    """Print the schema revision.

    Example: semjobs db current --url sqlite:///out/semjobs.sqlite"""
    from semjobs.db import migrate

    click.echo(migrate.current(url) or "(empty)")

"""The schema exists only through the migrations: up, down and up again on Postgres and on
SQLite, and the migrated schema matches the models."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool

from db import migrate
from db.models import Base

TABLES = {"jobs", "items", "outputs", "step_log", "item_stats"}


def _tables(url):
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _diff(url):
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()


@pytest.fixture(params=["postgres", "sqlite"])
def empty_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'm.sqlite'}"
    return request.getfixturevalue("pg_url")


def test_upgrade_downgrade_upgrade(empty_url):
    assert migrate.current(empty_url) is None
    migrate.upgrade(empty_url)
    assert migrate.current(empty_url) == "0001_initial"
    assert _tables(empty_url) == TABLES
    assert _diff(empty_url) == []
    migrate.downgrade(empty_url)
    assert migrate.current(empty_url) is None
    assert _tables(empty_url) == set()
    migrate.upgrade(empty_url)
    assert _tables(empty_url) == TABLES


def test_cli_db_upgrade_reads_url_from_settings(pg_url, monkeypatch):
    from click.testing import CliRunner

    from cli.main import main
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "database_url", pg_url)
    res = CliRunner().invoke(main, ["db", "upgrade"])
    assert res.exit_code == 0, res.output
    assert "0001_initial" in res.output
    assert _tables(pg_url) == TABLES

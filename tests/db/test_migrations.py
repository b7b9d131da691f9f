"""The schema exists only through the migrations: up, down and up again on Postgres and on
SQLite, and the migrated schema matches the models."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool, text

from semjobs.db import migrate
from semjobs.db.models import Base

TABLES = {"jobs", "items", "outputs", "step_log", "item_stats", "workers", "calibrations",
          "calibration_questions", "calibration_prefixes"}
HEAD = "0007_kept_samples"
NEW_STEP_COLS = {"target_tokens", "draft_text", "judge_score"}


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
    assert migrate.current(empty_url) == HEAD
    assert _tables(empty_url) == TABLES
    assert _diff(empty_url) == []
    migrate.downgrade(empty_url, "base")
    assert migrate.current(empty_url) is None
    assert _tables(empty_url) == set()
    migrate.upgrade(empty_url)
    assert _tables(empty_url) == TABLES


def test_cli_db_upgrade_reads_url_from_settings(pg_url, monkeypatch):
    from click.testing import CliRunner

    from semjobs.cli.main import main
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "database_url", pg_url)
    res = CliRunner().invoke(main, ["db", "upgrade"])
    assert res.exit_code == 0, res.output
    assert HEAD in res.output
    assert _tables(pg_url) == TABLES


def _step_columns(url):
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return {c["name"] for c in inspect(engine).get_columns("step_log")}
    finally:
        engine.dispose()


def _sql(url, statement):
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement))
            return result.all() if result.returns_rows else None
    finally:
        engine.dispose()


STEP = ("INSERT INTO step_log (id, item_pk, job_id, step_index, author, text, drafted_tokens, "
        "accepted_tokens, decision, seconds) VALUES (1, 1, 'j', 0, 'target', 'step', 0, 0, "
        "'target_only', 0.5)")


def test_0002_adds_and_drops_step_fields_keeping_rows(empty_url):
    """A database at 0001 with a step row: 0002 adds the nullable columns (old rows read NULL,
    new values store), and downgrading to 0001 drops them and keeps the row."""
    migrate.upgrade(empty_url, "0001_initial")
    assert not NEW_STEP_COLS & _step_columns(empty_url)
    _sql(empty_url, "INSERT INTO jobs (id, status, method, input_format, queue, n_items, config, "
         "manifest, created_at) VALUES ('j', 'running', 'ar', 'plain', 'q', 1, '{}', '{}', "
         "CURRENT_TIMESTAMP)")
    _sql(empty_url, "INSERT INTO items (id, job_id, seq, line, item_id, status, attempts, "
         "request) VALUES (1, 'j', 0, 1, 'i0', 'done', 1, '{}')")
    _sql(empty_url, STEP)

    migrate.upgrade(empty_url, "0002_step_log_engine_fields")
    assert NEW_STEP_COLS <= _step_columns(empty_url)
    cols = "text, target_tokens, draft_text, judge_score"
    assert _sql(empty_url, f"SELECT {cols} FROM step_log") == [("step", None, None, None)]
    _sql(empty_url, "UPDATE step_log SET target_tokens = 7, draft_text = 'd', judge_score = 9")
    assert _sql(empty_url, f"SELECT {cols} FROM step_log") == [("step", 7, "d", 9)]

    migrate.downgrade(empty_url, "0001_initial")
    assert migrate.current(empty_url) == "0001_initial"
    assert not NEW_STEP_COLS & _step_columns(empty_url)
    assert _sql(empty_url, "SELECT text, seconds FROM step_log") == [("step", 0.5)]
    migrate.upgrade(empty_url, HEAD)
    assert _diff(empty_url) == []


def _item_indexes(url):
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return {i["name"] for i in inspect(engine).get_indexes("items")}
    finally:
        engine.dispose()


def test_0003_adds_and_drops_worker_heartbeats_keeping_items(empty_url):
    """A database at 0002 with an item held by a worker: 0003 adds the workers table and the
    items.worker index (heartbeats store and read back), downgrading to 0002 drops both and
    keeps the item."""
    migrate.upgrade(empty_url, "0002_step_log_engine_fields")
    _sql(empty_url, "INSERT INTO jobs (id, status, method, input_format, queue, n_items, config, "
         "manifest, created_at) VALUES ('j', 'running', 'ar', 'plain', 'q', 1, '{}', '{}', "
         "CURRENT_TIMESTAMP)")
    _sql(empty_url, "INSERT INTO items (id, job_id, seq, line, item_id, status, attempts, "
         "request, worker) VALUES (1, 'j', 0, 1, 'i0', 'running', 1, '{}', 'w@h:1')")
    assert "workers" not in _tables(empty_url)

    migrate.upgrade(empty_url, HEAD)
    assert "workers" in _tables(empty_url) and "ix_items_worker" in _item_indexes(empty_url)
    _sql(empty_url, "INSERT INTO workers (name, started_at, heartbeat_at) "
         "VALUES ('w@h:1', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
    assert _sql(empty_url, "SELECT i.item_id FROM items i JOIN workers w ON w.name = i.worker"
                ) == [("i0",)]

    migrate.downgrade(empty_url, "0002_step_log_engine_fields")
    assert "workers" not in _tables(empty_url)
    assert "ix_items_worker" not in _item_indexes(empty_url)
    assert _sql(empty_url, "SELECT item_id, worker FROM items") == [("i0", "w@h:1")]
    migrate.upgrade(empty_url, HEAD)
    assert _diff(empty_url) == []


def _downgrade(url, *args, input=None):
    from click.testing import CliRunner

    from semjobs.cli.main import main

    return CliRunner().invoke(main, ["db", "downgrade", "--url", url, *args], input=input)


@pytest.fixture
def migrated_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'd.sqlite'}"
    migrate.upgrade(url)
    return url


def test_cli_db_downgrade_needs_an_explicit_revision(migrated_sqlite):
    res = _downgrade(migrated_sqlite, "--yes")
    assert res.exit_code == 2 and "--revision" in res.output
    assert _tables(migrated_sqlite) == TABLES


def test_cli_db_downgrade_asks_first_and_a_no_keeps_everything(migrated_sqlite):
    res = _downgrade(migrated_sqlite, "--revision", "base", input="n\n")
    assert res.exit_code == 1 and "drop every table and all data" in res.output and "Aborted" in res.output
    res = _downgrade(migrated_sqlite, "--revision", "base", input="")  # no terminal to answer
    assert res.exit_code == 1
    assert migrate.current(migrated_sqlite) == HEAD and _tables(migrated_sqlite) == TABLES


def test_cli_db_downgrade_confirmed_rolls_back(migrated_sqlite):
    res = _downgrade(migrated_sqlite, "--revision", "0002_step_log_engine_fields", input="y\n")
    assert res.exit_code == 0, res.output
    assert "drop the tables and columns added after it" in res.output
    assert migrate.current(migrated_sqlite) == "0002_step_log_engine_fields"
    res = _downgrade(migrated_sqlite, "--revision", "base", "--yes")
    assert res.exit_code == 0 and "?" not in res.output, res.output
    assert migrate.current(migrated_sqlite) is None and _tables(migrated_sqlite) == set()

"""Shared fixtures: real Postgres and Redis, one throw-away database and one queue per test.

Services (defaults match a local install; override with env vars):
- SEMJOBS_TEST_PG_ADMIN_URL  a database to connect to for CREATE/DROP DATABASE
  (default postgresql+psycopg://postgres@127.0.0.1:5432/postgres)
- SEMJOBS_TEST_REDIS_URL     (default redis://127.0.0.1:6379/15)
When a service is unreachable the tests that need it are skipped, unless
SEMJOBS_TEST_REQUIRE_SERVICES=1 (CI), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get(
    "SEMJOBS_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("SEMJOBS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
REQUIRE = os.environ.get("SEMJOBS_TEST_REQUIRE_SERVICES") == "1"
FAKE_ENGINE = "tests.fake_engine:InstantEngine.load"
# How long a worker may take to its first finished item, its engine's start included. Waiting
# ends at the first item, so the bound costs nothing when things go well; a vLLM worker's start
# took over 60 s under the parallel suite (scripts/test.sh) on a slow 2-core host.
FIRST_PROGRESS_S = 240


def require_vllm() -> None:
    """Skip the calling test where vLLM is not installed (fail it under
    SEMJOBS_TEST_REQUIRE_SERVICES=1, as CI sets: scripts/install.sh installs vLLM)."""
    from semspec.engine.token_engine import vllm_installed

    if not vllm_installed():
        (pytest.fail if REQUIRE else pytest.skip)("vLLM is not installed (scripts/install.sh installs it)")


def tiny_vllm_model(tmp_path_factory, arch: str = "llama") -> Path:
    """A tiny random model of ``arch`` (tests.tiny_models.ARCHITECTURES) vLLM's CPU attention runs
    (64-wide heads, as SmolLM2's)."""
    from tests.tiny_models import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp(f"tiny-vllm-{arch}") / "model", hidden_size=256, seed=3, arch=arch)


@pytest.fixture(scope="session")
def tiny_vllm_dir(tmp_path_factory):
    """tiny_vllm_model's Llama."""
    return tiny_vllm_model(tmp_path_factory)


def pytest_collection_modifyitems(items):
    """The files with slow tests first, in their order (a stable sort): run one file per
    process (scripts/test.sh: pytest-xdist, --dist loadfile, --no-loadscope-reorder), the long
    files start early and the many short ones even out the processes' ends, which would
    otherwise wait on the longest files (tests/worker/, minutes each) started last."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


def _unavailable(what: str, err: Exception):
    msg = f"{what} not reachable ({type(err).__name__}: {err})"
    if REQUIRE:
        pytest.fail(msg)
    pytest.skip(msg)


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def pg_url():
    """A fresh, empty Postgres database; dropped afterwards."""
    from sqlalchemy import create_engine, text

    name = f"sjtest_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as e:  # noqa: BLE001
        _unavailable("Postgres", e)
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    url = f"{base}/{name}"
    yield url
    from semjobs.db.session import forget

    forget(url)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def pg_db(pg_url):
    """A fresh Postgres database with the schema migrated to head."""
    from semjobs.db import migrate

    migrate.upgrade(pg_url)
    return pg_url


@pytest.fixture(autouse=True)
def last_run_file(tmp_path, monkeypatch):
    """Where this test's commands record their last job (semjobs.jobs.locate), not the user's cache."""
    from semjobs.settings import settings

    path = tmp_path / "last_run.json"
    monkeypatch.setattr(settings, "last_run_file", path)
    return path


@pytest.fixture
def sqlite_db(tmp_path):
    from semjobs.db import migrate

    url = f"sqlite:///{tmp_path / 'semjobs.sqlite'}"
    migrate.upgrade(url)
    yield url
    from semjobs.db.session import forget

    forget(url)


@pytest.fixture
def redis_url():
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as e:  # noqa: BLE001
        _unavailable("Redis", e)
    return REDIS_URL


@pytest.fixture
def queue(redis_url):
    """A queue name no other test run uses; its keys are deleted afterwards."""
    import redis

    name = f"sjtest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    r = redis.Redis.from_url(redis_url)
    for key in r.scan_iter(f"*{name}*"):
        r.delete(key)


@pytest.fixture
def fake_engine(monkeypatch):
    """In-process: the worker code calls the instant test-double engine."""
    from semjobs.settings import settings
    from semjobs.worker import engine as engines

    monkeypatch.setattr(settings, "engine_factory", FAKE_ENGINE)
    # `semjobs run` decodes in this process (its engine processes are spawned, ~5 s each:
    # tests/worker/test_engine_processes.py runs them)
    monkeypatch.setattr(settings, "processes", 1)
    monkeypatch.syspath_prepend(str(ROOT))
    engines._cache.clear()
    yield
    engines._cache.clear()


@pytest.fixture
def service_env(pg_db, redis_url, queue, last_run_file):
    """Environment for `semjobs` subprocesses talking to this test's database and queue."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        SEMJOBS_DATABASE_URL=pg_db,
        SEMJOBS_REDIS_URL=redis_url,
        SEMJOBS_QUEUE=queue,
        SEMJOBS_ENGINE_FACTORY=FAKE_ENGINE,
        SEMJOBS_CHUNK_SIZE="4",
        SEMJOBS_PROCESSES="1",  # one Celery node per `semjobs worker` (test_supervisor.py: more)
        SEMJOBS_LAST_RUN_FILE=str(last_run_file),
        # workers compile vLLM's graphs by default; here they start eager (a minute less per
        # start): what compiling buys is measured in docs/benchmarks.md, not in the tests
        SEMJOBS_VLLM_COMPILE="0",
    )
    return env


def semjobs_cmd() -> list[str]:
    return [sys.executable, "-m", "semjobs.cli"]


def run_cli(args: list[str], env: dict, check: bool = True, timeout: float = 120):
    proc = subprocess.run(
        [*semjobs_cmd(), *args], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"semjobs {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


class Workers:
    """Real `semjobs worker` (celery worker) subprocesses, stopped at teardown."""

    def __init__(self, env: dict, log_dir: Path):
        self.env, self.log_dir, self.procs = env, log_dir, []

    def start(self, name: str, *extra: str, env: dict | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"worker-{name}.log", "w")
        proc = subprocess.Popen(
            [*semjobs_cmd(), "worker", "-n", f"{name}@%h", "-l", "INFO", *extra],
            env={**self.env, **(env or {})}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def log(self, proc) -> str:
        return Path(proc.log_path).read_text()

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def workers(service_env, tmp_path):
    w = Workers(service_env, tmp_path)
    yield w
    w.stop_all()

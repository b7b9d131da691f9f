"""The deployment: docker-compose.yml, deploy/ and the Dockerfile (docs/security.md).

No container engine runs here, so the parts are run as far as this machine can: the Redis
service's own start-up script with this machine's redis-server, the Postgres roles script on a
private cluster of this machine's Postgres, and `docker-compose config` where it is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli
from tests.services import PrivatePostgres, free_port

COMPOSE = ROOT / "docker-compose.yml"
EXAMPLE_ENV = ROOT / "deploy" / "stack.env.example"
REQUIRED = re.compile(r"\$\{(\w+):\?")  # a variable `docker-compose` refuses to run without


@pytest.fixture(scope="module")
def stack() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _secrets() -> dict[str, str]:
    return {name: f"test-{name.lower().replace('_', '-')}" for name in REQUIRED.findall(COMPOSE.read_text())}


def test_no_database_or_broker_port_is_published_and_flower_only_on_loopback(stack):
    services = stack["services"]
    assert "ports" not in services["postgres"] and "ports" not in services["redis"]
    for service in services.values():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), port


def test_a_stopped_worker_has_time_to_finish_its_items_in_flight(stack):
    """Docker kills after 10 s unless told otherwise: mid-decode, costing each item an attempt."""
    grace = stack["services"]["worker"]["stop_grace_period"]
    value, unit = int(grace[:-1]), grace[-1]
    assert value * {"s": 1, "m": 60, "h": 3600}[unit] >= 60


def test_every_password_comes_from_an_uncommitted_env_file_that_the_example_lists():
    text = COMPOSE.read_text()
    assert not re.search(r"^\s*\w*(PASSWORD|_AUTH):\s*(?!\$\{)\S", text, re.M), "a literal secret in the file"
    assert not re.search(r"://\w+:(?!\$\{)[^@\s]+@", text), "a literal password in a URL"
    example = dict(line.split("=", 1) for line in EXAMPLE_ENV.read_text().splitlines()
                   if line and not line.startswith("#"))
    assert set(REQUIRED.findall(text)) <= set(example)
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT)
    assert ignored.returncode == 0, ".env is not ignored by git"


def test_the_service_and_the_migrations_log_in_as_different_roles_and_neither_is_the_superuser(stack):
    env = stack["x-semjobs-env"]
    migrate = stack["services"]["migrate"]["environment"]
    app_user = re.search(r"://(\w+):", env["SEMJOBS_DATABASE_URL"]).group(1)
    owner_user = re.search(r"://(\w+):", migrate["SEMJOBS_DATABASE_URL"]).group(1)
    superuser = stack["services"]["postgres"]["environment"]["POSTGRES_USER"]
    assert len({app_user, owner_user, superuser}) == 3
    for name in ("worker", "flower"):
        environment = stack["services"][name]["environment"]
        assert environment["SEMJOBS_DATABASE_URL"] == env["SEMJOBS_DATABASE_URL"]


def test_flower_asks_for_a_password(stack):
    flower = stack["services"]["flower"]
    assert "FLOWER_BASIC_AUTH" in flower["environment"]
    assert "FLOWER_UNAUTHENTICATED_API" not in COMPOSE.read_text()


def test_images_are_pinned_and_the_image_runs_as_a_user_from_the_gpu_lock(stack):
    for name, service in stack["services"].items():
        tag = service["image"].rpartition(":")[2]
        assert re.match(r"\d+\.\d+", tag), f"{name}: {service['image']} is not pinned to a release"
    dockerfile = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", dockerfile, re.M).group(1)
    assert re.match(r"python:\d+\.\d+\.\d+", base), base
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users and users[-1] not in ("root", "0")
    assert '-c requirements/cuda.lock ".[vllm]"' in dockerfile


def _redis_up(tmp_path: Path, stack: dict, maxmemory: str) -> tuple[subprocess.Popen, int]:
    """The redis service's own entrypoint script, run by this machine's redis-server."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    service = stack["services"]["redis"]
    script = service["command"][0].replace("$$", "$").replace("/tmp/users.acl", str(tmp_path / "users.acl"))
    port = free_port()
    script = script.replace("exec redis-server", f"exec redis-server --port {port} --bind 127.0.0.1")
    env = {**os.environ, "SEMJOBS_REDIS_PASSWORD": "s3cret", "REDIS_MAXMEMORY": maxmemory}
    proc = subprocess.Popen([*service["entrypoint"], script], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    for _ in range(100):
        try:
            redis.Redis(port=port, username="semjobs", password="s3cret").ping()
            return proc, port
        except redis.ConnectionError:
            proc.poll()
            assert proc.returncode is None, "redis-server did not start"
            subprocess.run(["sleep", "0.1"])
    raise AssertionError("redis-server did not answer")


def test_redis_wants_a_password_refuses_admin_commands_and_refuses_rather_than_evicts(tmp_path, stack):
    import redis

    proc, port = _redis_up(tmp_path, stack, maxmemory="3mb")
    try:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, username="semjobs", password="guess").ping()
        client = redis.Redis(port=port, username="semjobs", password="s3cret")
        for command in (("FLUSHALL",), ("CONFIG", "GET", "maxmemory"), ("SHUTDOWN",)):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(1000):  # 64 kB each: past 3 MB, a queued message would be refused
                client.lpush("queue", b"x" * 65536)
        assert client.llen("queue") == i  # nothing queued was evicted to make room
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture
def private_pg():
    server = PrivatePostgres()
    server.start()
    yield server
    server.remove()


def test_the_roles_script_leaves_the_service_no_power_but_over_rows(private_pg, redis_url, queue, tmp_path,
                                                                     last_run_file):
    """deploy/postgres-roles.sh on a fresh cluster, as the postgres image runs it; the
    migrations as the owner; a job submitted as the service; then what the service may not."""
    import sqlalchemy as sa

    admin = sa.create_engine(private_pg.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text("CREATE DATABASE semjobs"))
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(private_pg.port), "POSTGRES_USER": "postgres",
           "POSTGRES_DB": "semjobs", "SEMJOBS_OWNER_DB_PASSWORD": "o'wner", "SEMJOBS_APP_DB_PASSWORD": "app"}
    subprocess.run(["sh", str(ROOT / "deploy" / "postgres-roles.sh")], env=env, check=True, capture_output=True)

    base = f"127.0.0.1:{private_pg.port}/semjobs"
    service = {**os.environ, "SEMJOBS_REDIS_URL": redis_url, "SEMJOBS_QUEUE": queue,
               "SEMJOBS_LAST_RUN_FILE": str(last_run_file), "SEMJOBS_CHECK_PROMPT_LENGTHS": "false"}
    run_cli(["db", "upgrade"], {**service, "SEMJOBS_DATABASE_URL": f"postgresql+psycopg://semjobs_owner@{base}"})
    app_url = f"postgresql+psycopg://semjobs_app@{base}"
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "prompt": "What is 2+2?"}\n')
    run_cli(["submit", str(prompts)], {**service, "SEMJOBS_DATABASE_URL": app_url})

    app = sa.create_engine(app_url, isolation_level="AUTOCOMMIT")  # CREATE DATABASE runs outside one
    with app.connect() as c:
        assert c.scalar(sa.text("SELECT count(*) FROM items")) == 1
        assert not c.scalar(sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"))
    for forbidden in ("CREATE TABLE intruder (x int)", "DROP TABLE items",
                      "COPY (SELECT 1) TO PROGRAM 'true'", "CREATE DATABASE other"):
        with app.connect() as c, pytest.raises(sa.exc.ProgrammingError, match="permission denied|must be owner|must be superuser"):
            c.execute(sa.text(forbidden))
    app.dispose()
    admin.dispose()


def test_docker_compose_accepts_the_file_with_its_secrets_and_refuses_it_without(tmp_path):
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not installed (Debian: apt-get install docker-compose)")
    base = {k: v for k, v in os.environ.items() if k not in _secrets()}
    (tmp_path / "empty.env").write_text("")  # not a developer's own .env beside the file
    cmd = ["docker-compose", "--project-directory", str(ROOT), "--env-file", str(tmp_path / "empty.env"),
           "-f", str(COMPOSE), "config"]
    ok = subprocess.run(cmd, env={**base, **_secrets()}, cwd=tmp_path, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "test-semjobs-app-db-password" in ok.stdout
    missing = {k: v for k, v in _secrets().items() if k != "SEMJOBS_APP_DB_PASSWORD"}
    refused = subprocess.run(cmd, env={**base, **missing}, cwd=tmp_path, capture_output=True, text=True)
    assert refused.returncode != 0 and "SEMJOBS_APP_DB_PASSWORD" in refused.stderr

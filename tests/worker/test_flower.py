"""Flower against the test broker, read through its HTTP API while a job runs: it sees the
worker by its unique name, and each chunk's task by the job and input ids it serves, as
running while it runs and as succeeded after."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.conftest import ROOT, wait_for
from tests.services import free_port
from tests.worker.test_celery_e2e import submit, wait_completed, write_input

pytestmark = pytest.mark.slow


AUTH = ("admin", "flower-test")


def _get(port: int, path: str, auth: tuple[str, str] | None = AUTH):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth is not None:
        token = base64.b64encode(":".join(auth).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture
def flower(service_env, tmp_path):
    port = free_port()
    log = open(tmp_path / "flower.log", "w")
    # as the README starts it: on loopback, pages and API behind basic auth
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "semjobs.worker.celery:app", "flower",
                             f"--port={port}", "--address=127.0.0.1", f"--basic-auth={':'.join(AUTH)}"],
                            env=service_env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def up():
        try:
            _get(port, "/api/workers")
            return True
        except OSError:
            return False

    try:
        wait_for(up, 60, what="Flower's API")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_flower_refuses_whoever_lacks_the_password(flower):
    for auth in (None, ("admin", "guess")):
        with pytest.raises(urllib.error.HTTPError, match="401"):
            _get(flower, "/api/workers", auth)


def test_flower_sees_the_worker_and_its_running_tasks(service_env, workers, pg_db, tmp_path, flower):
    job_id = submit(service_env, write_input(tmp_path / "in.jsonl", 8))
    workers.start("fw", env={"FAKE_ENGINE_DELAY_S": "1.5", "SEMJOBS_BATCH_SIZE": "2"})

    def this_jobs():  # (tests running beside this one on the same Redis send Flower their tasks too)
        return [t for t in _get(flower, "/api/tasks").values() if t["uuid"].startswith(f"{job_id}-")]

    def running():
        return [t for t in this_jobs() if t["state"] == "STARTED"]

    started = wait_for(running, 60, what="a task Flower shows as running")
    assert any(f"job {job_id}: q0, q1, q2, q3" == t["args"] for t in started), started
    wait_completed(pg_db, job_id, workers)

    def all_succeeded():
        tasks = this_jobs()
        return len(tasks) == 2 and all(t["state"] == "SUCCESS" for t in tasks) and tasks

    tasks = wait_for(all_succeeded, 30, what="both chunks succeeded in Flower")
    assert sorted(t["args"] for t in tasks) == [f"job {job_id}: q0, q1, q2, q3", f"job {job_id}: q4, q5, q6, q7"]
    assert all(t["name"] == "semjobs.run_chunk" for t in tasks)
    # the workers Flower asks over the broker (refresh=1: now, not from its cache)
    names = wait_for(lambda: set(_get(flower, "/api/workers?refresh=1")), 30, what="Flower's workers")
    assert any(n.startswith("fw@") for n in names), names

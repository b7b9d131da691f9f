"""`semjobs worker --processes 2`: two real Celery nodes under one supervisor (instant
test-double engine, real Redis and Postgres): both consume, one SIGKILLed mid-item is started
again and its items are redone once, SIGTERM stops them all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select

from semjobs.db.models import Item, Output
from semjobs.db.session import session_factory
from tests.conftest import FIRST_PROGRESS_S, wait_for
from tests.worker.test_celery_e2e import submit, wait_completed, write_input

pytestmark = pytest.mark.slow


def node_pids(pid: int) -> dict[str, int]:
    """The supervisor's children by the Celery node name they were given (-n NAME@HOST)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    nodes = {}
    for child in map(int, out.split()):
        # the argv, or, once Celery retitles the process (setproctitle, which vLLM installs),
        # "[celeryd: NODE:MainProcess] ... (worker ... -n NODE)" in one string
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        nodes[re.search(r"-n (\S+)", cmdline).group(1).split("@")[0]] = child
    return nodes


def running_on(url, job_id, node):
    with session_factory(url)() as s:
        return s.scalars(select(Item).where(Item.job_id == job_id, Item.status == "running",
                                            Item.worker.like(f"{node}@%"))).all()


def test_two_worker_processes_restart_a_killed_one_and_stop_on_sigterm(service_env, workers, pg_db, tmp_path):
    env = {**service_env, "SEMJOBS_VISIBILITY_TIMEOUT_S": "4", "FAKE_ENGINE_DELAY_S": "0.3",
           "SEMJOBS_BATCH_SIZE": "2", "SEMJOBS_HEARTBEAT_INTERVAL_S": "0.5",
           "SEMJOBS_WORKER_DEAD_AFTER_S": "2"}
    workers.env = env
    sup = workers.start("sup", "--processes", "2", "--threads", "1")
    wait_for(lambda: workers.log(sup).count(" ready.") == 2, FIRST_PROGRESS_S, what="both worker processes ready")
    assert "2 processes, 1 torch thread(s) each" in workers.log(sup)
    first = node_pids(sup.pid)
    assert set(first) == {"sup-0", "sup-1"}

    n = 24
    job_id = submit(env, write_input(tmp_path / "in.jsonl", n))
    wait_for(lambda: running_on(pg_db, job_id, "sup-0") and running_on(pg_db, job_id, "sup-1"), FIRST_PROGRESS_S,
             interval=0.05, what="both processes decoding")
    os.kill(first["sup-0"], signal.SIGKILL)
    killed = {i.seq for i in running_on(pg_db, job_id, "sup-0")}
    wait_for(lambda: "process 0 exited with code -9; starting it again" in workers.log(sup), 30,
             what="the supervisor restarting it")
    wait_completed(pg_db, job_id, workers)

    with session_factory(pg_db)() as s:
        items = {i.seq: i for i in s.scalars(select(Item).where(Item.job_id == job_id))}
        n_out = s.scalar(select(func.count()).select_from(Output).where(Output.job_id == job_id))
    assert n_out == n and all(i.status == "done" for i in items.values())
    assert killed and all(items[seq].attempts == 2 for seq in killed)  # redone once
    after = node_pids(sup.pid)
    assert set(after) == {"sup-0", "sup-1"}
    assert after["sup-1"] == first["sup-1"] and after["sup-0"] != first["sup-0"]

    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=60) == 0
    assert not any(os.path.exists(f"/proc/{pid}") for pid in after.values())


def test_a_process_that_keeps_dying_at_start_stops_the_supervisor(monkeypatch, capsys):
    import sys

    from semjobs.worker import supervisor

    monkeypatch.setattr(supervisor, "RESTART_DELAY_S", 0.01)
    sup = supervisor.Supervisor([[sys.executable, "-c", "raise SystemExit(3)"]])
    assert sup.run() == 1
    assert sup.quick_deaths == [supervisor.MAX_QUICK_DEATHS]
    err = capsys.readouterr().err
    assert err.count("exited with code 3; starting it again") == supervisor.MAX_QUICK_DEATHS - 1
    assert "died 5 times within 30 s of starting (last exit code 3); stopping" in err

"""The service's folders install as semjobs.<folder> (setup.py): they import under those names
from any directory, not only from the repository's root, where the folders lie at hand."""

from __future__ import annotations

import subprocess
import sys


def test_every_service_folder_imports_as_a_semjobs_package_from_elsewhere(tmp_path):
    code = ("import semjobs.cli.main, semjobs.db.models, semjobs.jobs.schema, semjobs.worker.celery, "
            "semjobs.migrations; import importlib.util as u; print(u.find_spec('worker') is None)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"  # nothing generic beside other packages


def test_the_processes_semjobs_worker_starts_run_from_elsewhere(tmp_path, monkeypatch):
    """On a CPU `semjobs worker` runs one process per core under a supervisor: each must start
    whatever the directory (a deployment's, a container's)."""
    from semjobs.cli import worker as worker_cli
    from semjobs.worker import supervisor

    started: list[list[str]] = []

    class Recorder:
        def __init__(self, commands):
            started.extend(commands)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(supervisor, "Supervisor", Recorder)
    assert worker_cli._supervise(2, 1, ["q"], None, "INFO", 0) == 0
    assert len(started) == 2
    program = started[0][: started[0].index("worker")]  # the interpreter and its module
    out = subprocess.run([*program, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "submit" in out.stdout, out.stderr[-2000:]

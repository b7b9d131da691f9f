"""`semjobs worker` as several worker processes on one machine: on a CPU, one per core.

Each child is a whole `semjobs worker` of its own (a Celery node with its own name, threads
pool, engine and batch loop; docs/batching.md, "One engine process per core", says why one
process per core beats one process with a thread per core). Celery's prefork pool is not used
for this because its children run one task, i.e. one chunk of a few items, at a time, which
would shrink every batch to a chunk.

The supervisor only starts, restarts and stops them: SIGTERM or SIGINT is passed on (Celery's
warm shutdown: each child finishes or hands back its chunks) and waited for; a child that
exits on its own (killed, out of memory) is started again, and its chunks come back through
the broker or the dead-worker reaper like any lost worker's. The children die with the
supervisor (Linux), so a killed supervisor leaves no worker consuming.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from semjobs.worker.engine_processes import die_with_parent

RESTART_DELAY_S = 1.0
# A child that dies this soon after starting, this many times in a row, is a broken setup
# (a bad setting, a queue that cannot be reached), not bad luck: stop instead of looping.
QUICK_DEATH_S, MAX_QUICK_DEATHS = 30.0, 5


class Supervisor:
    def __init__(self, argv_for: list[list[str]]):
        self.argv_for = argv_for  # each child's command line
        self.procs: list[subprocess.Popen] = []
        self.started: list[float] = []
        self.quick_deaths = [0] * len(argv_for)
        self.stopping = False

    def _start(self, i: int) -> subprocess.Popen:
        return subprocess.Popen(self.argv_for[i], preexec_fn=die_with_parent)

    def _forward(self, signum, _frame) -> None:
        self.stopping = True
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)

    def run(self) -> int:
        """Start every child, keep them running until a signal, then wait for them; the exit
        code: 0 after a signal, 1 when a child keeps dying at start."""
        previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _loop(self) -> int:
        self.procs = [self._start(i) for i in range(len(self.argv_for))]
        self.started = [time.monotonic()] * len(self.procs)
        while True:
            alive = 0
            for i, p in enumerate(self.procs):
                if p.poll() is None:
                    alive += 1
                    continue
                if self.stopping:
                    continue
                lived = time.monotonic() - self.started[i]
                self.quick_deaths[i] = self.quick_deaths[i] + 1 if lived < QUICK_DEATH_S else 0
                if self.quick_deaths[i] >= MAX_QUICK_DEATHS:
                    print(f"semjobs worker: process {i} died {MAX_QUICK_DEATHS} times within "
                          f"{QUICK_DEATH_S:.0f} s of starting (last exit code {p.returncode}); "
                          "stopping", file=sys.stderr, flush=True)
                    self._forward(signal.SIGTERM, None)
                    self._wait()
                    return 1
                print(f"semjobs worker: process {i} exited with code {p.returncode}; starting it "
                      "again", file=sys.stderr, flush=True)
                time.sleep(RESTART_DELAY_S)
                self.procs[i], self.started[i] = self._start(i), time.monotonic()
                alive += 1
            if self.stopping and alive == 0:
                return 0
            time.sleep(0.2)

    def _wait(self) -> None:
        for p in self.procs:
            p.wait()

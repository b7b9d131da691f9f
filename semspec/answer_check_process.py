"""A helper process that runs a check with a wall-clock time limit, from any thread.

math-verify's own timeouts use signals, which work only in a process's main thread, and
answers are checked in worker threads (Celery's threads pool, the engine's result handling),
so :mod:`semspec.answers` runs math-verify here: in a long-lived helper process, started on
the first check, one per process that checks answers. A check past its time limit kills the
helper (the only way to stop sympy mid-computation) and raises :class:`CheckTimedOut`; the
next check starts a fresh helper.

The helper is a plain subprocess (``python -c``), not a multiprocessing child: `semjobs run`'s
engine processes are daemonic multiprocessing children, and multiprocessing refuses to start
children from those. Like a spawned child it gets its parent's ``sys.path``. It does not
outlive its parent: the parent kills it at exit, it ends when its stdin closes, and a watchdog
ends it when it is orphaned mid-check (the parent killed).

Protocol: one JSON line per request (the function's arguments) and one per reply
(``{"ok": result}`` or ``{"error": message}``), so arguments and results are JSON values.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

# What the helper runs: the parent's sys.path (so the same modules import), then serve()
_BOOTSTRAP = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
              "from semspec.answer_check_process import serve; serve(sys.argv[2])")


class CheckTimedOut(TimeoutError):
    """The check ran past its time limit; its helper process was killed."""


class CheckFailed(RuntimeError):
    """The check raised, its reply could not be read, or the helper process died."""


class CheckProcess:
    """Calls ``function`` ("module:name", imported by name in the helper) in a helper process,
    one call at a time: threads share it and wait their turn (each turn is bounded by its time
    limit). ``warm_up`` are arguments for a first call made when the helper starts, so that
    the imports and caches the function builds on first use (sympy, math-verify's parsers) are
    paid under ``start_timeout`` instead of a check's limit."""

    def __init__(self, function: str, warm_up: tuple, start_timeout: float = 60.0):
        self.function = function
        self.warm_up = warm_up
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        atexit.register(self.close)

    @property
    def pid(self) -> int | None:
        """The helper's process id; None while there is none."""
        process = self._process
        return process.pid if process else None

    def call(self, *args, timeout: float):
        """``function(*args)`` in the helper, waiting for it at most ``timeout`` seconds (not
        counting a helper's start). CheckTimedOut past that, CheckFailed if it fails."""
        with self._lock:
            if self._process is None:
                self._start()
            return self._request(args, timeout)

    def close(self) -> None:
        """Stop the helper, if one runs; the next call starts another."""
        with self._lock:
            self._kill()

    def _start(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, json.dumps(sys.path), self.function],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self._request(self.warm_up, self.start_timeout)

    def _request(self, args: tuple, timeout: float):
        """Send one request and return its reply's result; on any failure the helper is
        killed, as a late reply would answer the next request."""
        try:
            reply = self._exchange(args, time.monotonic() + timeout)
        except BaseException:  # timed out, died, interrupted
            self._kill()
            raise
        if "error" in reply:
            raise CheckFailed(reply["error"])
        return reply["ok"]

    def _exchange(self, args: tuple, deadline: float) -> dict:
        try:
            self._process.stdin.write(json.dumps(args).encode() + b"\n")
        except BrokenPipeError as e:
            raise self._exited() from e
        line = self._read_line(deadline)
        try:
            return json.loads(line)
        except ValueError as e:
            raise CheckFailed(f"the check process's reply is no JSON: {line[:200]!r}") from e

    def _read_line(self, deadline: float) -> bytes:
        # poll, not select: select cannot watch descriptors above 1023, which a busy worker reaches
        fd = self._process.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        received = b""
        while not received.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise CheckTimedOut(f"{self.function} took more than its time limit")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise self._exited()
            received += chunk
        return received

    def _exited(self) -> CheckFailed:
        return CheckFailed(f"the check process exited (code {self._process.wait()})")

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()
            process.stdin.close()
            process.stdout.close()


def serve(function: str) -> None:
    """The helper's loop: answer each request on stdin with the function's result on stdout,
    until stdin closes."""
    replies = _protocol_stdout()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    _exit_when_orphaned()
    module, name = function.split(":")
    run = getattr(importlib.import_module(module), name)
    for line in sys.stdin:
        try:
            reply = json.dumps({"ok": run(*json.loads(line))})
        except Exception as e:  # noqa: BLE001  (reported to the caller, which decides)
            reply = json.dumps({"error": f"{type(e).__name__}: {e}"})
        replies.write(reply + "\n")
        replies.flush()


def _protocol_stdout():
    """The real stdout, kept for replies; what the checked code prints goes to stderr, where
    it cannot be mistaken for a reply."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return replies


def _exit_when_orphaned() -> None:
    """Exit once the parent is gone: an orphan stuck in a check would never read the end of
    its stdin. A thread, as the main one is busy checking (sympy's Python code lets it run)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="orphan-watchdog", daemon=True).start()

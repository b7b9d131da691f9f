"""The helper process that runs a check under a wall-clock time limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from semspec.answer_check_process import CheckFailed, CheckProcess, CheckTimedOut


@pytest.fixture
def make_checker():
    made = []

    def make(function, warm_up):
        made.append(CheckProcess(function, warm_up))
        return made[-1]

    yield make
    for checker in made:
        checker.close()


def test_a_call_past_its_limit_is_cut_and_the_next_one_restarts(make_checker):
    checker = make_checker("time:sleep", (0,))
    assert checker.call(0, timeout=5) is None
    first = checker.pid
    t0 = time.perf_counter()
    with pytest.raises(CheckTimedOut):
        checker.call(30, timeout=0.5)
    assert time.perf_counter() - t0 < 2.5
    assert checker.pid is None and not _running(first)  # killed
    assert checker.call(0, timeout=5) is None
    assert checker.pid not in (None, first)


def test_an_error_in_the_check_is_raised_and_the_helper_goes_on(make_checker):
    checker = make_checker("builtins:int", ("1",))
    assert checker.call("12", timeout=5) == 12
    helper = checker.pid
    with pytest.raises(CheckFailed, match="ValueError"):
        checker.call("x", timeout=5)
    assert checker.call("5", timeout=5) == 5 and checker.pid == helper


def test_what_the_check_prints_is_no_reply(make_checker):
    checker = make_checker("builtins:print", ("warm",))
    assert checker.call('{"ok": 1}', timeout=5) is None  # printed to stderr, the reply is print's


def test_a_helper_that_cannot_start_fails_the_call(make_checker):
    checker = make_checker("no_such_module_anywhere:check", ())
    with pytest.raises(CheckFailed, match="exited"):
        checker.call(timeout=30)


def test_threads_share_one_helper(make_checker):
    checker = make_checker("builtins:abs", (0,))
    results = {}

    def call(i):
        results[i] = [checker.call(-i * 100 - j, timeout=10) for j in range(20)]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: [i * 100 + j for j in range(20)] for i in range(4)}


PARENT = textwrap.dedent("""
    import sys
    from semspec.answer_check_process import CheckProcess
    checker = CheckProcess("time:sleep", (0,))
    checker.call(0, timeout=30)
    print(checker.pid, flush=True)
    if sys.argv[1] == "busy":
        checker.call(60, timeout=120)
""")


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _running(pid)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_the_helper_ends_when_its_parent_exits():
    parent = subprocess.run([sys.executable, "-c", PARENT, "idle"], capture_output=True, text=True,
                            timeout=60)
    assert parent.returncode == 0, parent.stderr
    assert _gone_within(int(parent.stdout), 5)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_the_helper_ends_when_its_parent_is_killed_mid_check():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "busy"], stdout=subprocess.PIPE, text=True)
    try:
        helper = int(parent.stdout.readline())
        time.sleep(0.5)  # the helper is in its 60 s check
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _gone_within(helper, 5)  # orphaned: its watchdog ends it
    finally:
        parent.kill()
        parent.stdout.close()

"""The Celery app is configured for long GPU tasks (late acks, prefetch 1, one visibility
timeout), and importing it loads no model."""

import re
import subprocess
import sys

import pytest

from semspec.types import METHODS

from tests.conftest import ROOT


def test_celery_settings():
    from semjobs.settings import settings
    import semjobs.worker.tasks  # noqa: F401  (registers the task)
    from semjobs.worker.celery import app, make_app
    from semjobs.worker.queues import queue_name

    c = app.conf
    assert c.task_acks_late and c.task_reject_on_worker_lost
    assert c.worker_prefetch_multiplier == 1
    vt = settings.visibility_timeout_s
    assert c.broker_transport_options["visibility_timeout"] == vt
    assert c.result_backend_transport_options["visibility_timeout"] == vt
    assert c.worker_send_task_events
    assert c.task_default_queue == queue_name()
    assert "semjobs.run_chunk" in app.tasks
    s2 = settings.model_copy(update={"target_model": "/m/R1-Distill-Qwen-32B",
                                     "draft_model": "/m/R1-Distill-Qwen-1.5B", "queue": None})
    assert queue_name(s2) == "semjobs.R1-Distill-Qwen-32B+R1-Distill-Qwen-1.5B"
    assert make_app(s2).conf.task_default_queue == queue_name(s2)


PAIR = "semjobs.R1-Distill-Qwen-32B+R1-Distill-Qwen-1.5B"


@pytest.mark.parametrize("methods, queue, consumed", [
    # every method: each method's queue, the calibrations', and the pair's own (jobs queued
    # before queues were per method)
    (None, None, [f"{PAIR}.{m}" for m in METHODS] + [f"{PAIR}.calibrate", PAIR]),
    # semspec only: its queue and the calibrations' (it holds the step engines)
    (["semspec"], None, [f"{PAIR}.semspec", f"{PAIR}.calibrate"]),
    # token methods only: no calibration (that would load the step engines beside them)
    (["token_sd", "ar"], None, [f"{PAIR}.token_sd", f"{PAIR}.ar"]),
    # one queue named: everything goes there
    (None, "mine", ["mine"]),
])
def test_a_worker_consumes_the_queues_of_the_methods_it_serves(methods, queue, consumed):
    from semjobs.settings import Settings
    from semjobs.worker.queues import CALIBRATION, queue_name, worker_queues

    s = Settings(target_model="/m/R1-Distill-Qwen-32B", draft_model="/m/R1-Distill-Qwen-1.5B", methods=methods,
                 queue=queue)
    assert worker_queues(s) == consumed
    # what submit and probe collect --submit send to is among them, for what the worker serves
    for kind in (methods or METHODS):
        assert queue_name(s, kind) in consumed
    if queue or methods is None or "semspec" in methods:
        assert queue_name(s, CALIBRATION) in consumed


@pytest.mark.parametrize("env, problem", [
    ({"SEMJOBS_METHODS": "semspec,semspek"}, "unknown method(s) 'semspek'"),
    ({"SEMJOBS_METHODS": "semspec", "SEMJOBS_QUEUE": "mine"}, "methods and queue cannot go together"),
])
def test_a_method_list_the_workers_cannot_serve_is_refused(monkeypatch, env, problem):
    from pydantic import ValidationError

    from semjobs.settings import Settings

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=re.escape(problem)):
        Settings()


def test_methods_read_from_the_environment(monkeypatch):
    from semjobs.settings import Settings

    monkeypatch.setenv("SEMJOBS_METHODS", " semspec, step_judge,semspec ")
    assert Settings().methods == ["semspec", "step_judge"]


def test_importing_the_worker_loads_no_engine_and_no_torch():
    code = (
        "import sys, semjobs.worker.tasks, semjobs.worker.engine as e, semjobs.cli.main;"
        "assert not e.loaded();"
        "assert 'torch' not in sys.modules, 'torch imported by the worker parent'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_heartbeat_code_does_not_import_the_task_module():
    """liveness -> recovery -> publish, never back to semjobs.worker.tasks (which imports liveness),
    not even inside a function."""
    import ast

    from tests.conftest import ROOT

    for module in ("liveness", "recovery", "publish", "orphans"):
        tree = ast.parse((ROOT / "worker" / f"{module}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "semjobs.worker.tasks" not in imported and "semjobs.worker.process" not in imported, module


def test_an_outage_is_one_warning_and_beats_back_off_within_the_dead_after_time(monkeypatch, caplog):
    import logging

    from semjobs.settings import settings
    from semjobs.worker import liveness

    monkeypatch.setattr(settings, "heartbeat_interval_s", 5.0)
    monkeypatch.setattr(settings, "worker_dead_after_s", 45.0)
    assert [liveness.retry_delay(k) for k in range(4)] == [5.0, 10.0, 15.0, 15.0]

    calls, sleeps, reaps = [], [], []

    def tick(reap=True):
        calls.append(1)
        reaps.append(reap)
        if len(calls) <= 3:
            raise RuntimeError("connection refused\nDETAIL: a long traceback-like text")
        if len(calls) == 5:
            raise SystemExit  # end the loop

    monkeypatch.setattr(liveness, "tick", tick)
    monkeypatch.setattr(liveness.time, "sleep", sleeps.append)
    caplog.set_level(logging.INFO)
    import pytest

    with pytest.raises(SystemExit):
        liveness._run()
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "failed, retrying with back-off" in m]) == 1
    assert any("connection refused" in m and "DETAIL" not in m for m in lines)
    assert any("answer again" in m for m in lines) and not any(r.exc_info for r in caplog.records)
    assert sleeps == [10.0, 15.0, 15.0, 5.0]
    # from the outage on, nobody is reaped (every heartbeat looks old) for the dead-after time
    assert reaps == [True, False, False, False, False]

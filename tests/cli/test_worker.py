"""`semjobs worker` (semjobs.cli.worker): what a long-lived worker process loads its engines with."""

from __future__ import annotations

import pytest
from click.testing import CliRunner


@pytest.mark.parametrize("setting, compiled", [(None, True), (False, False), (True, True)])
def test_a_worker_compiles_vllms_graphs_unless_told_not_to(monkeypatch, setting, compiled):
    """Unset, a worker (which decodes for hours) loads compiled engines; `run`, `bench` and
    `probe` stay eager (start-up dominates there); SEMJOBS_VLLM_COMPILE decides either way."""
    from semjobs.cli.main import main
    from semjobs.settings import settings
    from semjobs.worker import celery, engine, engine_processes

    monkeypatch.setattr(settings, "vllm_compile", setting)
    monkeypatch.setattr(settings, "engine_factory", None)
    assert engine.factory_for("ar")[1]["compile"] is bool(setting)  # before the worker decides
    monkeypatch.setattr(engine_processes, "plan", lambda: (1, 1))
    monkeypatch.setattr(celery.app, "worker_main", lambda argv: None)
    res = CliRunner().invoke(main, ["worker"])
    assert res.exit_code == 0, res.output
    assert engine.factory_for("ar")[1]["compile"] is compiled


def test_a_worker_of_some_methods_consumes_their_queues_and_its_processes_too(monkeypatch):
    """`--method semspec` takes semspec's jobs (and calibrations, which run on its engines),
    no other method's; the processes a supervisor starts are told the same."""
    from semjobs.cli.main import main
    from semjobs.settings import settings
    from semjobs.worker import celery, engine_processes
    from semjobs.worker.queues import CALIBRATION, queue_name

    monkeypatch.setattr(settings, "methods", None)
    monkeypatch.setattr(settings, "queue", None)
    argv, children = [], []
    monkeypatch.setattr(celery.app, "worker_main", argv.extend)
    monkeypatch.setattr(engine_processes, "plan", lambda: (1, 1))
    res = CliRunner().invoke(main, ["worker", "--method", "semspec"])
    assert res.exit_code == 0, res.output
    assert settings.methods == ["semspec"]
    queues = argv[argv.index("-Q") + 1].split(",")
    assert queues == [queue_name(kind="semspec"), queue_name(kind=CALIBRATION)]
    assert queue_name(kind="ar") not in queues

    class Supervisor:
        def __init__(self, commands):
            children.extend(commands)

        def run(self):
            return 0

    monkeypatch.setattr("semjobs.worker.supervisor.Supervisor", Supervisor)
    monkeypatch.setattr(engine_processes, "plan", lambda: (2, 1))
    res = CliRunner().invoke(main, ["worker", "--method", "semspec", "--method", "step_judge"])
    assert res.exit_code == 0, res.output
    assert len(children) == 2
    for command in children:
        assert [command[i + 1] for i, word in enumerate(command) if word == "--method"] == ["semspec", "step_judge"]


def test_a_method_list_cannot_go_with_one_named_queue(monkeypatch):
    from semjobs.cli.main import main
    from semjobs.settings import settings

    monkeypatch.setattr(settings, "queue", "mine")
    res = CliRunner().invoke(main, ["worker", "--method", "semspec"])
    assert res.exit_code == 2 and "SEMJOBS_QUEUE" in res.output

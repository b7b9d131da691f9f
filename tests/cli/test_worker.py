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

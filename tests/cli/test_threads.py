"""SEMJOBS_THREADS reaches torch in the embedded path: a real `semjobs run` subprocess on
SQLite with the instant test-double engine, which reports torch's thread count into the
manifest (no servers)."""

import json
import os

import pytest
from pydantic import ValidationError

from semjobs.settings import Settings
from tests.conftest import FAKE_ENGINE, ROOT, run_cli


def test_run_sets_torch_threads_before_the_engine_loads(tmp_path):
    n = (os.cpu_count() or 1) + 1  # differs from torch's default (at most one per core)
    env = dict(os.environ, PYTHONPATH=str(ROOT), SEMJOBS_THREADS=str(n),
               SEMJOBS_ENGINE_FACTORY=FAKE_ENGINE)
    out = tmp_path / "out.jsonl"
    run_cli(["run", str(ROOT / "examples" / "prompts.jsonl"), "-o", str(out),
             "--db", f"sqlite:///{tmp_path / 'db.sqlite'}", "--max-new-tokens", "8"], env)
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert manifest["identities"]["torch_threads"] == str(n)


def test_threads_setting_rejects_zero(monkeypatch):
    monkeypatch.setenv("SEMJOBS_THREADS", "0")
    with pytest.raises(ValidationError):
        Settings()

"""Fixtures of the worker tests: what real workers decode with, and the instant double in
place of vLLM's engine factories."""

from __future__ import annotations

import pytest

from tests.fake_engine import InstantEngine

# the vLLM factories, as the instant double (vllm_double names them by module path)
load_as_vllm = load_as_vllm_steps = InstantEngine.load


@pytest.fixture
def vllm_double(monkeypatch):
    """semjobs.worker.engine with vLLM's factories replaced by the instant double, no engine
    loaded and no engine arguments set."""
    from semjobs.settings import settings
    from semjobs.worker import engine as engines

    monkeypatch.setattr(engines, "VLLM_FACTORY", f"{__name__}:load_as_vllm")
    monkeypatch.setattr(engines, "VLLM_STEPS_FACTORY", f"{__name__}:load_as_vllm_steps")
    monkeypatch.setattr(settings, "engine_factory", None)
    monkeypatch.setattr(settings, "target_engine_args", {})
    monkeypatch.setattr(settings, "draft_engine_args", {})
    monkeypatch.setattr(engines, "_cache", {})
    monkeypatch.setattr(engines, "_users", {})


@pytest.fixture(params=["fake", "vllm"])
def decoding(request):
    """What the workers decode with: (environment, submit options). The instant test double,
    or vLLM on a tiny random model (64-wide heads, as its CPU attention needs), whose 300
    tokens an item take long enough to be killed mid-item (its loops kept: a random model soon
    repeats itself, and a cut loop would end its items early)."""
    if request.param == "fake":
        return {}, ()
    from tests.conftest import require_vllm

    require_vllm()
    model = request.getfixturevalue("tiny_vllm_dir")
    return ({"SEMJOBS_ENGINE_FACTORY": "", "SEMJOBS_TARGET_MODEL": str(model),
             "SEMJOBS_DRAFT_MODEL": "none", "SEMJOBS_KV_CACHE_GB": "0.25", "SEMJOBS_VLLM_COMPILE": "0"},
            ("--max-new-tokens", "300", "--keep-loops"))

"""Fixtures of the worker tests that run real workers."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["fake", "vllm"])
def decoding(request, tmp_path_factory):
    """What the workers decode with: (environment, submit options). The instant test double,
    or vLLM on a tiny random model (64-wide heads, as its CPU attention needs), whose 300
    tokens an item take long enough to be killed mid-item."""
    if request.param == "fake":
        return {}, ()
    from semspec.testing import tiny_model_dir
    from semspec.vllm_engine import vllm_installed
    from tests.conftest import REQUIRE

    if not vllm_installed():
        (pytest.fail if REQUIRE else pytest.skip)("vLLM is not installed (scripts/install.sh installs it)")
    model = tiny_model_dir(tmp_path_factory.mktemp("vllm-model") / "model", hidden_size=256, seed=3)
    return ({"SEMJOBS_ENGINE_FACTORY": "", "SEMJOBS_ENGINE": "vllm", "SEMJOBS_TARGET_MODEL": str(model),
             "SEMJOBS_DRAFT_MODEL": "none", "SEMJOBS_KV_CACHE_GB": "0.25"}, ("--max-new-tokens", "300"))

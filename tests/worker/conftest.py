"""Fixtures of the worker tests that run real workers."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["fake", "vllm"])
def decoding(request):
    """What the workers decode with: (environment, submit options). The instant test double,
    or vLLM on a tiny random model (64-wide heads, as its CPU attention needs), whose 300
    tokens an item take long enough to be killed mid-item."""
    if request.param == "fake":
        return {}, ()
    from tests.conftest import require_vllm

    require_vllm()
    model = request.getfixturevalue("tiny_vllm_dir")
    return ({"SEMJOBS_ENGINE_FACTORY": "", "SEMJOBS_TARGET_MODEL": str(model),
             "SEMJOBS_DRAFT_MODEL": "none", "SEMJOBS_KV_CACHE_GB": "0.25", "SEMJOBS_VLLM_COMPILE": "0"},
            ("--max-new-tokens", "300"))

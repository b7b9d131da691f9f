"""Shared fixtures for the engine tests: tiny random models, and the real SmolLM2 (slow)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Tiny models gain nothing from intra-op threads, and on a shared 2-core machine spinning
# thread pools make every forward pass several times slower (measured: 0.69 s vs 0.08 s per
# SmolLM2 decode step under load). SEMJOBS_TEST_THREADS overrides.
torch.set_num_threads(int(os.environ.get("SEMJOBS_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Two tiny model dirs sharing one tokenizer (target: 2 layers, draft: 1 layer) and a
    third with a different tokenizer."""
    from semspec.testing import tiny_model_dir

    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": tiny_model_dir(root / "target", num_layers=2, seed=0),
        "draft": tiny_model_dir(root / "draft", num_layers=1, seed=1),
        "other_tok": tiny_model_dir(root / "other", num_layers=1, seed=2, vocab_size=300,
                                    seed_text="A different corpus makes different merges."),
    }


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_target(tiny_dirs, tiny_cache):
    from semspec.models import load_model

    return load_model(str(tiny_dirs["target"]), device="cpu", cache_dir=tiny_cache)


@pytest.fixture(scope="session")
def tiny_draft(tiny_dirs, tiny_cache):
    from semspec.models import load_model

    return load_model(str(tiny_dirs["draft"]), device="cpu", cache_dir=tiny_cache)


@pytest.fixture(scope="session")
def tiny_other(tiny_dirs, tiny_cache):
    from semspec.models import load_model

    return load_model(str(tiny_dirs["other_tok"]), device="cpu", cache_dir=tiny_cache)


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded target, converted once into the shared model cache."""
    from semspec.models import load_model

    cache = os.environ.get("SEMJOBS_MODEL_CACHE")
    return load_model(None, device="cpu", cache_dir=Path(cache) if cache else None)

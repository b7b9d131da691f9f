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
    from tests.tiny_models import tiny_model_dir

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
    from semspec.models.loaded import load_model

    return load_model(str(tiny_dirs["target"]), device="cpu", cache_dir=tiny_cache)


@pytest.fixture(scope="session")
def tiny_draft(tiny_dirs, tiny_cache):
    from semspec.models.loaded import load_model

    return load_model(str(tiny_dirs["draft"]), device="cpu", cache_dir=tiny_cache)


@pytest.fixture(scope="session")
def tiny_other(tiny_dirs, tiny_cache):
    from semspec.models.loaded import load_model

    return load_model(str(tiny_dirs["other_tok"]), device="cpu", cache_dir=tiny_cache)


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded target, converted once into the shared model cache."""
    from semspec.models.loaded import load_model

    cache = os.environ.get("SEMJOBS_MODEL_CACHE")
    return load_model(None, device="cpu", cache_dir=Path(cache) if cache else None)


@pytest.fixture(scope="session")
def tiny_vllm_greedy(tiny_vllm_dir, tiny_cache):
    """greedy_reference on the tiny vLLM model."""
    return greedy_reference(tiny_vllm_dir, tiny_cache)


def greedy_reference(model_dir: Path, cache: Path):
    """``greedy(prompt, max_new_tokens) -> (text, finish_reason, tokens)``: transformers' own
    float32 greedy generate on the model in ``model_dir``, the reference vLLM's greedy text must
    equal."""
    from semspec.models.loaded import load_model
    from semspec.prompts import encode_prompt

    model = load_model(str(model_dir), device="cpu", cache_dir=cache, dtype=torch.float32)
    tok, eos = model.tokenizer, sorted(model.eos_token_ids)

    def greedy(prompt, max_new_tokens: int) -> tuple[str, str, int]:
        ids = torch.tensor([encode_prompt(tok, prompt)])
        with torch.no_grad():
            out = model.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                       do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
        new = out[0, ids.shape[1]:].tolist()
        finish = "eos" if new and new[-1] in eos else "length"
        new = new[:-1] if finish == "eos" else new
        return tok.decode(new, skip_special_tokens=True), finish, len(new)

    return greedy

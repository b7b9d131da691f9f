"""benchmarks/draft_cost.py: its greedy speculation loop and the simulated counters agree."""

import importlib.util
from pathlib import Path

import pytest
import torch

from semspec.models.identity import ModelIdentity
from semspec.models.loaded import LoadedModel

from .conftest import tiny_target

_spec = importlib.util.spec_from_file_location(
    "draft_cost", Path(__file__).resolve().parents[3] / "benchmarks" / "draft_cost.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _loaded(model, vocab_ids=None):
    return LoadedModel(model=model, tokenizer=None, identity=ModelIdentity("tiny", "0"),
                       device=torch.device("cpu"), dtype=torch.float32, vocab_ids=vocab_ids)


@pytest.mark.parametrize("reduced_vocab", [False, True])
def test_speculation_loop_is_exact_and_matches_simulation(reduced_vocab):
    t, d = tiny_target(layers=4), tiny_target(layers=4)
    with torch.no_grad():
        for p, q in zip(d.parameters(), t.parameters()):
            p.copy_(q + 0.02 * torch.randn_like(q))
    vocab = torch.arange(0, t.config.vocab_size, 2) if reduced_vocab else None
    t, d = _loaded(t), _loaded(d, vocab)
    for seed in range(3):
        torch.manual_seed(seed)
        prompt = torch.randint(3, 128, (7,)).tolist()
        ref, _ = bench.greedy(t, prompt, 30, {2})
        for gamma in (1, 4):
            sp = bench.speculate(t, d, prompt, 30, gamma, {2})
            assert sp["tokens"] == ref
            sim = bench.simulate_greedy_sd(bench.draft_predictions(d, prompt, ref), ref, gamma, 30)
            assert (sp["accepted"], sp["drafted"], sp["verifications"]) == (
                sim["accepted"], sim["drafted"], sim["verifications"])

"""Calibration with a draft head: its sampled steps and pooled states are what the engine's
HeadStream computes when the head drafts after a prefix, and collect() runs on the pair."""

from __future__ import annotations

import pytest
import torch

from semspec.calibration.collect import CollectConfig, collect
from semspec.calibration.transformers_models import TransformersModels, sample_steps
from semspec.calibration.head_steps import head_step_features
from semspec.calibration.store import CalibrationStore
from semspec.head import HeadModel
from semspec.models import LoadedModel, ModelIdentity, encode_prompt, load_model
from semspec.probes import pool
from semspec.runner import ModelRunner
from semspec.stream import HeadStream, Stream
from semspec.testing import run_alone, tiny_model_dir


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target = load_model(tiny_model_dir(tmp_path_factory.mktemp("m") / "t", num_layers=2, hidden_size=64), device="cpu")
    torch.manual_seed(5)
    head = HeadModel(target.model, layers=1)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return target, LoadedModel(head.eval(), target.tokenizer, ModelIdentity("h", "2" * 64), target.device, target.dtype)


def _engine_draft(target, head, prefix, steps_tokens=None, greedy_len=0):
    """What the engine's streams do: the target has run the prefix but its last token (a
    target-written step's end is pending), the head drafts from there."""
    T = Stream(ModelRunner(target, 1), prefix[:-1])
    D = HeadStream(ModelRunner(head, 1), [], T)
    T.slot, D.slot = T.runner.alloc(), D.runner.alloc()
    run_alone(T.forward(keep_for=[]))
    T.append(prefix[-1:])
    D.append(prefix)
    run_alone(D.forward(keep_for=[]))
    rows, toks = [], []
    for i in range(len(steps_tokens) if steps_tokens is not None else greedy_len):
        x = steps_tokens[i] if steps_tokens is not None else int(D.next_logits.argmax())
        toks.append(x)
        D.append([x])
        rows.append(run_alone(D.forward(keep_for=[])).hidden)
    return toks, pool(torch.cat(rows)[None])[0]


def test_head_states_over_a_step_are_the_engine_s(pair):
    target, head = pair
    prefix = encode_prompt(target.tokenizer, "How many clips did Natalia sell?")
    step = [40, 41, 42, 43, 44]
    want = _engine_draft(target, head, prefix, step)[1]
    got = head_step_features(head, target, prefix, [step, step[:2]])
    torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)
    assert got.shape == (2, 64)


def test_head_greedy_samples_are_the_engine_s_drafts(pair):
    target, head = pair
    prefix = encode_prompt(target.tokenizer, "Weng earns $12 an hour.")
    steps = sample_steps(head, prefix, 2, 0.0, 1.0, "\n\n", 6, target=target)
    assert steps[0].tokens == steps[1].tokens
    n = len(steps[0].tokens)
    assert n >= 1 and steps[0].tokens == _engine_draft(target, head, prefix, greedy_len=n)[0]
    with pytest.raises(ValueError, match="target"):
        sample_steps(head, prefix, 1, 0.0, 1.0, "\n\n", 6)


def test_collect_runs_with_a_head(pair, tmp_path):
    target, head = pair
    cfg = CollectConfig(samples=2, max_step_tokens=5, max_trace_tokens=10, max_trace_steps=2, max_prefixes=2)
    stats = collect(TransformersModels(target, head), [("q1", "How many clips did Natalia sell?")], tmp_path / "cal", cfg)
    assert stats["prefixes_new"] >= 1
    store = CalibrationStore(tmp_path / "cal")
    rec = store.read_prefix(store.keys()[0])
    assert rec.sources == ["target"] * 2 + ["draft"] * 2
    assert rec.features["draft"].shape == (4, 64)

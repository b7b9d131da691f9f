"""Calibration on vLLM (semspec.calibration.vllm_models): with tiny random models, float32,
the states it pools, its greedy samples and traces are transformers' (the path calibration
took before), sampled steps follow the engine's step rule, a run records the engine, and
engine arguments reach the engines."""

from __future__ import annotations

import gc

import pytest
import torch

from semspec.calibration.collect import CollectConfig, SampledStep, collect, prefix_ids
from semspec.calibration.store import CalibrationStore
from semspec.calibration.transformers_models import TransformersModels
from semspec.models.loaded import load_model
from semspec.probes import step_features
from semspec.steps import step_spans
from tests.tiny_models import tiny_model_dir
from tests.conftest import require_vllm

PROMPT = "How many clips did Natalia sell?"
# the target's states at a middle layer; the draft's at its last (normed as transformers' are)
CFG = CollectConfig(samples=3, layer=1, draft_layer=-1, max_step_tokens=8, max_trace_tokens=24, max_trace_steps=3,
                    step_delimiter="\n")
# vLLM's own engine arguments per role, as `probe collect --engine-arg / --draft-engine-arg` pass them
ENGINE_ARGS, DRAFT_ENGINE_ARGS = {"max_model_len": 384}, {"max_model_len": 320}


@pytest.fixture(scope="module")
def both(tmp_path_factory, tiny_cache):
    """(the pair on vLLM, the same pair on transformers)."""
    require_vllm()
    from semspec.calibration.backends import load_models

    root = tmp_path_factory.mktemp("pair")
    t = tiny_model_dir(root / "t", num_layers=2, hidden_size=256, seed=3)
    d = tiny_model_dir(root / "d", num_layers=1, hidden_size=256, seed=4)
    on_vllm = load_models(str(t), str(d), CFG, device="cpu", cache_dir=tiny_cache, dtype="float32", batch_size=8,
                          kv_cache_gb=0.1, engine_args=ENGINE_ARGS, draft_engine_args=DRAFT_ENGINE_ARGS)
    yield on_vllm, TransformersModels(load_model(str(t), device="cpu"), load_model(str(d), device="cpu"))
    del on_vllm
    gc.collect()  # gone before the next module's engine starts


def test_pooled_states_are_transformers_at_the_stored_layers(both):
    on_vllm, reference = both
    prefix = prefix_ids(on_vllm.tokenizer("target"), PROMPT, "Step one.\n")
    steps = [[40, 41, 42], [50], [60, 61, 62, 63, 64, 65, 66]]
    for role in ("target", "draft"):
        (got,) = on_vllm.features(role, [(prefix, steps)], CFG)
        (want,) = reference.features(role, [(prefix, steps)], CFG)
        assert got.shape == (3, 256)
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    # the same through the prefix cache a second time, beside another prefix
    other = prefix_ids(on_vllm.tokenizer("target"), "Weng earns $12 an hour.", "")
    again, beside = on_vllm.features("target", [(prefix, steps), (other, steps[:1])], CFG)
    torch.testing.assert_close(again, step_features(reference.models["target"], prefix, steps, 1), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(beside, step_features(reference.models["target"], other, steps[:1], 1),
                               atol=2e-3, rtol=2e-3)


def test_greedy_samples_and_trace_are_transformers(both):
    on_vllm, reference = both
    greedy = CollectConfig(**{**CFG.__dict__, "temperature": 0.0, "trace_temperature": 0.0})
    prompt = prefix_ids(on_vllm.tokenizer("target"), PROMPT, "")
    for role in ("target", "draft"):
        (got,) = on_vllm.sample(role, [(prompt, 1)], greedy)
        (want,) = reference.sample(role, [(prompt, 1)], greedy)
        assert [s.tokens for s in got] == [want[0].tokens] * 3
        assert [s.end for s in got] == [want[0].end] * 3
    assert on_vllm.trace(prompt, greedy, seed=1) == reference.trace(prompt, greedy, seed=1)


def test_sampled_steps_follow_the_engine_step_rule(both):
    on_vllm, _ = both
    tok = on_vllm.tokenizer("target")
    sampled = CollectConfig(**{**CFG.__dict__, "samples": 6, "temperature": 1.0, "top_p": 1.0})
    steps, other = on_vllm.sample("draft", [(prefix_ids(tok, PROMPT, ""), 5), (prefix_ids(tok, "Say hi.", ""), 6)],
                                  sampled)
    assert len(other) == 6
    assert len(steps) == 6 and len({tuple(s.tokens) for s in steps}) > 1
    for s in steps:
        assert s.end in ("delimiter", "eos", "cap", "think_end", "length")
        assert len(s.tokens) <= 8 and s.text == tok.decode(s.tokens, skip_special_tokens=False)
        if s.tokens:  # nothing in it ends a step before its last token
            assert step_spans(tok, s.tokens, on_vllm._detector(sampled)) == [(0, len(s.tokens))]


def test_a_delimiter_before_any_text_does_not_end_a_step(both):
    """vLLM stops at the delimiter wherever it comes; the step rule only after some text."""
    on_vllm, _ = both
    tok = on_vllm.tokenizer("target")
    blank, word = tok.encode("\n", add_special_tokens=False), tok.encode("ab\nc", add_special_tokens=False)
    detector = on_vllm._detector(CFG)
    assert on_vllm._cut(on_vllm.served["target"], detector, blank, 8, CFG).end is None
    step = on_vllm._cut(on_vllm.served["target"], detector, blank + word, 8, CFG)
    assert step.end == "delimiter" and step.text.strip() == "ab" and isinstance(step, SampledStep)


def test_collect_records_the_engine_and_refuses_layers_it_does_not_store(both, tmp_path):
    on_vllm, _ = both
    stats = collect(on_vllm, [("q1", PROMPT)], tmp_path / "cal", CFG)
    store = CalibrationStore(tmp_path / "cal")
    assert stats["prefixes_new"] >= 1 and len(store.keys()) == stats["prefixes_total"]
    meta = store.meta()
    assert meta["engine"] == "vllm " + meta["engine"].split()[1] + " float32"
    assert meta["layer"] == {"target": 1, "draft": -1}
    rec = store.read_prefix(store.keys()[0])
    assert rec.features["target"].shape == rec.features["draft"].shape == (6, 256)
    assert rec.sources == ["target"] * 3 + ["draft"] * 3
    with pytest.raises(ValueError, match="stores hidden_states\\[1\\]"):
        collect(on_vllm, [("q1", PROMPT)], tmp_path / "other", CollectConfig(**{**CFG.__dict__, "layer": -1}))
    with pytest.raises(ValueError, match="other settings"):  # a transformers run cannot resume it
        collect(TransformersModels(both[1].models["target"], both[1].models["draft"]), [("q1", PROMPT)],
                tmp_path / "cal", CFG)


def test_engine_arguments_reach_each_role_s_engine(both):
    on_vllm, _ = both
    for role, args in (("target", ENGINE_ARGS), ("draft", DRAFT_ENGINE_ARGS)):
        served = on_vllm.served[role]
        assert served.llm.model_config.max_model_len == served.facts.max_context == args["max_model_len"]

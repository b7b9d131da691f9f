import json

import pytest
import torch

from semspec.calibration.collect import CollectConfig, collect, read_prompts
from semspec.calibration.store import CalibrationStore
from semspec.calibration.transformers_models import TransformersModels


@pytest.fixture(scope="module")
def models(pair):
    return TransformersModels(*pair)


def test_collect_is_resumable_and_capped(pair, models, tmp_path):
    target, draft = pair
    prompts = [("q1", "How many clips did Natalia sell?"), ("q2", "Weng earns $12 an hour.")]
    cfg = CollectConfig(samples=3, max_step_tokens=6, max_trace_tokens=18, max_trace_steps=3,
                        max_prefixes=2)
    stats = collect(models, prompts, tmp_path / "cal", cfg)
    assert stats["prefixes_new"] == 2 and stats["prefixes_total"] == 2
    store = CalibrationStore(tmp_path / "cal")
    rec = store.read_prefix(store.keys()[0])
    assert rec.sources == ["target"] * 3 + ["draft"] * 3
    assert rec.features["target"].shape == (6, 64)
    assert rec.features["draft"].shape == (6, 32)
    meta = store.meta()
    assert meta["layer"] == {"target": -1, "draft": -1}
    assert meta["models"]["target"]["identity"] == str(target.identity)

    # Raising the cap resumes: nothing done twice, same traces, more prefixes.
    first = {k: store.read_prefix(k).texts for k in store.keys()}
    cfg.max_prefixes = 4
    stats2 = collect(models, prompts, tmp_path / "cal", cfg)
    assert stats2["prefixes_done_before"] == 2
    trace_ids = [json.loads(x)["question_id"] for x in (tmp_path / "cal" / "traces.jsonl").read_text().splitlines()]
    assert len(trace_ids) == len(set(trace_ids))  # no trace generated twice
    assert stats2["prefixes_total"] == min(4, len(store.keys()))
    for k, texts in first.items():
        assert store.read_prefix(k).texts == texts

    # Same run from scratch samples the same steps (seeds derive from question and k).
    collect(models, prompts, tmp_path / "cal2", cfg)
    store2 = CalibrationStore(tmp_path / "cal2")
    assert {k: store2.read_prefix(k).texts for k in first} == first

    # Other settings in the same directory are refused.
    with pytest.raises(ValueError, match="other settings"):
        collect(models, prompts, tmp_path / "cal", CollectConfig(samples=5))


def test_read_prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join([
        json.dumps({"question": "q0", "answer": "a"}),
        json.dumps({"id": "x", "prompt": "q1"}),
        json.dumps({"custom_id": "y", "body": {"messages": [{"role": "user", "content": "q2"}]}}),
    ]) + "\n")
    assert read_prompts(p) == [("line0", "q0"), ("x", "q1"), ("y", "q2")]
    assert read_prompts(p, skip=1, limit=1) == [("x", "q1")]


def test_target_only_run_memoises_samples_for_the_full_run(pair, models, tmp_path):
    target, draft = pair
    prompts = [("q1", "How many clips did Natalia sell?")]
    cfg = CollectConfig(samples=3, max_step_tokens=6, max_trace_tokens=12, max_trace_steps=2)
    stats = collect(TransformersModels(pair[0]), prompts, tmp_path / "a", cfg)
    assert stats["prefixes_new"] >= 1
    store = CalibrationStore(tmp_path / "a")
    assert store.keys() == []  # nothing complete without the draft
    memo = sorted(p.name for p in (tmp_path / "a" / "samples").glob("target__*.json"))
    assert len(memo) == stats["prefixes_new"]
    collect(models, prompts, tmp_path / "a", cfg)
    collect(models, prompts, tmp_path / "b", cfg)
    other = CalibrationStore(tmp_path / "b")
    assert store.keys() == other.keys()
    for k in store.keys():
        a, b = store.read_prefix(k), other.read_prefix(k)
        assert a.texts == b.texts
        assert torch.allclose(a.features["target"], b.features["target"], atol=1e-5)


def test_resume_refuses_other_model_weights(tmp_path):
    store = CalibrationStore(tmp_path)
    meta = {"target": "embedded:x", "draft": "embedded:y", "samples": 2,
            "models": {"draft": {"identity": "/c/y@sha256:" + "1" * 64}}}
    store.init(meta)
    store.init(meta)  # same weights: fine
    meta["models"]["draft"]["identity"] = "/c/y@sha256:" + "2" * 64
    with pytest.raises(ValueError, match="draft model"):
        store.init(meta)


def test_prefixes_spread_over_the_whole_trace_past_the_cap():
    from semspec.calibration.collect import prefix_positions

    assert prefix_positions(3, 12) == [0, 1, 2]  # all of them when they fit
    assert prefix_positions(20, 4) == [0, 6, 13, 19]  # first and last step included
    assert prefix_positions(20, 4, "first") == [0, 1, 2, 3]  # the shipped probes' recipe
    assert len(set(prefix_positions(100, 12))) == 12 and prefix_positions(5, 1) == [0]
    with pytest.raises(ValueError, match="spread"):
        prefix_positions(5, 2, "middle")


def test_a_collection_from_before_the_prefix_setting_resumes_only_as_first(tmp_path):
    """Collections written before `prefixes` existed took the trace's first steps: they resume
    under that recipe, and a spread run in the same directory is refused."""
    store = CalibrationStore(tmp_path)
    old = {"target": "t", "draft": "d", "samples": 2, "models": {}}
    store.init(old)
    store.init({**old, "prefixes": "first"})
    with pytest.raises(ValueError, match="prefixes"):
        store.init({**old, "prefixes": "spread"})


def test_prompts_are_rendered_with_the_chat_template_kwargs(tmp_path):
    """A thinking model's probes calibrated for jobs that switch thinking off: the prompt
    rendered with enable_thinking false (an empty thought) differs from the default one,
    and the stored states are those over it; collect.json records the kwargs, and a resume
    with others is refused."""
    from semspec.calibration.collect import prefix_ids, step_ids
    from semspec.models.loaded import load_model
    from semspec.prompts import render_prompt
    from tests.tiny_models import tiny_model_dir

    target = load_model(tiny_model_dir(tmp_path / "t", num_layers=2, hidden_size=64, seed=0, thinking=True),
                        device="cpu")
    draft = load_model(tiny_model_dir(tmp_path / "d", num_layers=1, hidden_size=32, seed=1, thinking=True),
                       device="cpu")
    models, tok = TransformersModels(target, draft), target.tokenizer
    prompt, kwargs = "How many clips did Natalia sell?", {"enable_thinking": False}
    assert render_prompt(tok, prompt, template_kwargs=kwargs) != render_prompt(tok, prompt)
    cfg = CollectConfig(samples=2, max_step_tokens=6, max_trace_tokens=12, max_trace_steps=1,
                        chat_template_kwargs=kwargs)
    collect(models, [("q1", prompt)], tmp_path / "cal", cfg)
    store = CalibrationStore(tmp_path / "cal")
    assert store.meta()["chat_template_kwargs"] == kwargs
    rec = store.read_prefix(store.keys()[0])
    # the target's states over the draft's steps (re-tokenized, as collect scores them)
    rows = [i for i, source in enumerate(rec.sources) if source == "draft"]
    steps = [step_ids(tok, models.eos("target"), rec.texts[i], own=False) for i in rows]

    def states(template_kwargs):
        ids = prefix_ids(tok, prompt, rec.prefix_text, template_kwargs)
        return models.features("target", [(ids, steps)], cfg)[0]

    assert torch.allclose(rec.features["target"][rows], states(kwargs), atol=1e-5)
    assert not torch.allclose(rec.features["target"][rows], states(None), atol=1e-3)
    with pytest.raises(ValueError, match="chat_template_kwargs"):
        collect(models, [("q1", prompt)], tmp_path / "cal", CollectConfig(**{**cfg.__dict__,
                                                                              "chat_template_kwargs": None}))

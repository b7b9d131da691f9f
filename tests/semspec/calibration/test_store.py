import json

import pytest
import torch

from semspec.calibration.store import CalibrationStore, PrefixRecord, merge_stores

META = {"target": "t", "draft": "d", "samples": 2, "layer": {"target": -1, "draft": -1}, "pooling": "mean",
        "step_delimiter": "\n", "max_step_tokens": 8, "prompts": 1,
        "models": {"target": {"identity": "t@sha256:" + "a" * 64}, "draft": {"identity": "d@sha256:" + "b" * 64}}}


def shard(root, questions, meta=None, text="step"):
    store = CalibrationStore(root)
    store.init({**META, **(meta or {}), "prompts": len(questions)})
    for q in questions:
        store.append_trace(q, [f"{q} first line", "second line"])
        store.write_prefix(PrefixRecord(
            key=f"{q}__000", question_id=q, k=0, prompt=f"question {q}", prefix_text="",
            texts=[text, text], sources=["target", "draft"],
            features={"target": torch.ones(2, 4), "draft": torch.zeros(2, 3)},
        ))
    return root


def test_merge_joins_disjoint_shards_and_is_idempotent(tmp_path):
    a = shard(tmp_path / "a", ["q1", "q2"])
    b = shard(tmp_path / "b", ["q3"], meta={"seed": 5})  # another seed is still the same process
    stats = merge_stores(tmp_path / "m", [a, b])
    assert stats == {"questions": 3, "prefixes": 3, "added": {"traces": 3, "prefixes": 3}}
    m = CalibrationStore(tmp_path / "m")
    assert m.meta()["prompts"] == 3 and len(m.meta()["merged_from"]) == 2
    rec = m.read_prefix("q3__000")
    assert rec.texts == ["step", "step"] and torch.equal(rec.features["draft"], torch.zeros(2, 3))
    assert set(m.load_traces()) == {"q1", "q2", "q3"}
    again = merge_stores(tmp_path / "m", [a, b])
    assert again["added"] == {"traces": 0, "prefixes": 0}
    assert len((tmp_path / "m" / "traces.jsonl").read_text().splitlines()) == 3


def test_merge_refuses_other_settings_and_conflicting_prefixes(tmp_path):
    a = shard(tmp_path / "a", ["q1"])
    other = shard(tmp_path / "o", ["q2"], meta={"samples": 4})
    with pytest.raises(ValueError, match="samples"):
        merge_stores(tmp_path / "m", [a, other])
    assert not (tmp_path / "m").exists()  # nothing half written
    clash = shard(tmp_path / "c", ["q1"], text="another step")
    with pytest.raises(ValueError, match="q1"):
        merge_stores(tmp_path / "m2", [a, clash])
    with pytest.raises(FileNotFoundError):
        merge_stores(tmp_path / "m3", [tmp_path])
    assert json.loads((tmp_path / "a" / "collect.json").read_text())["samples"] == 2


def test_a_collection_from_before_the_recipe_settings_merges_with_one_that_names_them(tmp_path):
    """Greedy traces cut at their first steps: what a collect.json without `prefixes` and
    `trace_temperature` meant; such a shard merges with one that says so, not with a
    paper-recipe one."""
    from semspec.calibration.store import CalibrationStore, merge_stores

    base = {"target": "t", "draft": "d", "samples": 2, "models": {}, "layer": {}, "pooling": "mean"}
    CalibrationStore(tmp_path / "old").init(base)
    CalibrationStore(tmp_path / "named").init({**base, "prefixes": "first", "trace_temperature": 0.0})
    CalibrationStore(tmp_path / "paper").init({**base, "prefixes": "spread", "trace_temperature": 0.6})
    assert merge_stores(tmp_path / "m", [tmp_path / "old", tmp_path / "named"])["prefixes"] == 0
    with pytest.raises(ValueError, match="other settings"):
        merge_stores(tmp_path / "m2", [tmp_path / "old", tmp_path / "paper"])

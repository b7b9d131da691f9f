"""benchmarks/head_eval.py: a head artifact scored on its build's cached report traces gets
the figures its build reported, and another head on the same traces gets its own."""

import importlib.util
import json
from pathlib import Path

import pytest

from semspec.draft.config import HeadTrainConfig
from semspec.draft.head_build import build_head

_spec = importlib.util.spec_from_file_location(
    "head_eval", Path(__file__).resolve().parents[3] / "benchmarks" / "head_eval.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from semspec.testing import tiny_model_dir

    root = tmp_path_factory.mktemp("head_eval")
    target = str(tiny_model_dir(root / "target", num_layers=2))
    data = root / "q.jsonl"
    rows = [{"question": f"What is {i} times {i + 2}?", "answer": f"#### {i * (i + 2)}"} for i in range(30)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = HeadTrainConfig(data=str(data), holdout=4, greedy_prompts=8, sampled_prompts=8, reference_prompts=4,
                          max_new_tokens=16, select_every=0, unroll=2, gen_batch_size=4, steps=40, lr=1e-2,
                          batch_size=4, threads=1, eval_fraction=0.25, eval_depths=(1, 2, 4))
    cache = str(root / "cache")
    first = build_head(cfg, root / "a", target, cache_dir=cache)
    second = build_head(HeadTrainConfig(**{**cfg.to_dict(), "steps": 2}), root / "b", target, cache_dir=cache)
    return cfg, target, cache, root, first, second


def test_each_head_gets_the_figures_of_its_build_on_the_same_traces(built):
    cfg, target, cache, root, first, second = built
    got = bench.score_heads(cfg, {"a": str(root / "a"), "b": str(root / "b")}, cache, target)
    assert got["report_traces"] == first["eval"]["traces"]
    assert first["eval"]["top1_by_depth"] != second["eval"]["top1_by_depth"]  # two heads told apart
    for name, meta in (("a", first), ("b", second)):
        ev = got["heads"][name]
        assert ev["top1_by_depth"] == meta["eval"]["top1_by_depth"]
        assert ev["mean_accepted"] == meta["eval"]["mean_accepted"]
        assert ev["positions_by_depth"] == meta["eval"]["positions_by_depth"]

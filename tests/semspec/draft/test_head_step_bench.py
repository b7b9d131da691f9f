"""benchmarks/head_step.py: it times real training steps of the recipe's kind in each number
type and turns the median into the recipe's training minutes."""

import importlib.util
from pathlib import Path

import pytest

from semspec.draft.config import HeadTrainConfig

from .conftest import tiny_target

_spec = importlib.util.spec_from_file_location(
    "head_step", Path(__file__).resolve().parents[3] / "benchmarks" / "head_step.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_each_number_type_is_timed_and_scaled_to_the_recipes_steps():
    cfg = HeadTrainConfig(batch_size=2, threads=1, steps=50, stop_after=30)
    result = bench.measure(tiny_target(), ["float32", "bfloat16"], steps=2, length=12, prompt_len=4, cfg=cfg)
    assert result["recipe_steps"] == 30 and result["auto_picks"] in ("bfloat16", "float32")
    for r in result["dtypes"].values():
        assert len(r["seconds"]) == 2 and all(s > 0 for s in r["seconds"])
        assert r["recipe_training_min"] == pytest.approx(r["median_s"] * 30 / 60)


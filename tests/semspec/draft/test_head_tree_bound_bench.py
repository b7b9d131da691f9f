"""benchmarks/head_tree_bound.py: the target answers the questions given, and the head's chain
and tree figures are measured on those answers."""

import importlib.util
import json
from pathlib import Path

from semspec.draft.config import HeadTrainConfig
from semspec.draft.head_build import build_head

_spec = importlib.util.spec_from_file_location(
    "head_tree_bound", Path(__file__).resolve().parents[3] / "benchmarks" / "head_tree_bound.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_chain_and_tree_figures_on_fresh_answers(tmp_path):
    from semspec.testing import tiny_model_dir

    target = str(tiny_model_dir(tmp_path / "target", num_layers=2))
    data = tmp_path / "q.jsonl"
    rows = [{"question": f"What is {i} times {i + 2}?", "answer": f"#### {i * (i + 2)}"} for i in range(24)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = HeadTrainConfig(data=str(data), holdout=4, greedy_prompts=8, sampled_prompts=8, reference_prompts=4,
                          max_new_tokens=16, select_every=0, unroll=2, gen_batch_size=4, steps=4, batch_size=4,
                          threads=1, eval_fraction=0.25, eval_depths=(1, 2))
    build_head(cfg, tmp_path / "head", target)
    questions = [r["question"] for r in rows[20:]]
    got = bench.tree_bound(str(tmp_path / "head"), target, questions, widths=(2, 8), draft_tokens=3,
                           max_new_tokens=20, batch_size=4, cache_dir=None)
    assert got["questions"] == got["traces"] == 4 and got["answer_tokens"] > 0
    assert got["full_tree_tokens"] == {"2": 2 + 4 + 8, "8": 8 + 64 + 512} and got["accept_k"] == 3
    within = got["mean_accepted_within_top"]
    assert got["mean_accepted"] <= within["2"] <= within["8"] <= 3

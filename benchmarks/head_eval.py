"""Held-out figures of draft head artifacts, side by side on one build's report traces.

A head's ``head.json`` holds the figures of its own build, measured on that build's held-out
traces; a head built on another host (or from other traces) was measured on other text.
This scores every head given on the same traces: the held-out report traces of the build
whose cache ``--cache-dir`` names (``semjobs draft train --kind eagle --cache-dir``, default
settings but for ``--sampled-answers``, which changes the traces and so the report set),
through ``semspec.draft.head_train.evaluate_depths`` -- the figures the build
reports (top-1 agreement by draft depth, the mean accepted length of 6 drafted tokens).

    python benchmarks/head_eval.py --cache-dir ~/.cache/semjobs/head-train \
        --heads new=semspec/assets/head,old=/tmp/head_v2 --out docs/benchmarks/head/v3/held_out.json

The cache's traces are keyed by the number type they were decoded in, which ``--threads``
decides as it did for the build (the build's default is 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_json  # noqa: E402
from semspec.draft.config import HeadTrainConfig  # noqa: E402
from semspec.draft.head_data import build_traces, cached_target_states, selection_split, split_traces  # noqa: E402
from semspec.draft.head_train import evaluate_depths  # noqa: E402
from semspec.head import load_head  # noqa: E402
from semspec.models import load_model  # noqa: E402

TARGET = "embedded:smollm2-135m"


def score_heads(cfg: HeadTrainConfig, heads: dict[str, str], cache_dir: str, target_spec: str = TARGET) -> dict:
    """``evaluate_depths`` of each head (name -> artifact dir) on the report traces of the
    build that ``cfg`` describes, read from its cache (answers the cache lacks are decoded)."""
    from semspec.engine import Engine

    torch.set_num_threads(cfg.threads)
    engine = Engine.load(target_spec, draft="none", probes="none", batch_size=cfg.gen_batch_size)
    traces = build_traces(engine, cfg, cache_dir)
    del engine
    target = load_model(target_spec, device="cpu", dtype=torch.float32)
    states = cached_target_states(target, traces, cache_dir)
    _, held = split_traces(traces, cfg.eval_fraction)
    _, report = selection_split(held)  # the build's selection traces are not scored, as in the build
    result = {"report_traces": len(report), "heads": {}}
    for name, path in heads.items():
        head = load_head(path, target)
        ev = evaluate_depths(head.model, target, head.vocab_ids, [traces[i] for i in report],
                             [states[i] for i in report], depths=cfg.eval_depths, stride=cfg.eval_stride)
        result["heads"][name] = {"dir": str(path), **ev}
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", required=True, help="the head build's cache (its traces and states)")
    ap.add_argument("--heads", required=True, help="comma-separated NAME=DIR of head artifacts")
    ap.add_argument("--threads", type=int, default=HeadTrainConfig().threads)
    ap.add_argument("--sampled-answers", type=int, default=HeadTrainConfig().sampled_answers,
                    help="the build's --sampled-answers: whose report traces to score on")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    heads = dict(h.split("=", 1) for h in args.heads.split(","))
    cfg = HeadTrainConfig(threads=args.threads, sampled_answers=args.sampled_answers)
    result = score_heads(cfg, heads, args.cache_dir)
    for name, ev in result["heads"].items():
        print(name, {d: round(v, 3) for d, v in ev["top1_by_depth"].items()},
              f"mean accepted {ev['mean_accepted']:.3f}", flush=True)
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What one training step of the draft head costs on this machine, in each number type.

A step of ``semjobs draft train --kind eagle`` (``semspec.draft.head_train.train_step``: the
unrolled loss, its backward, gradient clipping and the AdamW update) on a batch of the build's shape -- ``--batch-size``
traces of ``--length`` tokens, ``--prompt-len`` of them prompt -- with random tokens and
states (the cost does not depend on the values). It reports the median seconds a step in
each ``--dtypes`` entry and what the recipe's steps would take at that rate, so the build's
training time can be read off before a build, and whether ``train_dtype`` "auto" picks the
faster type here.

    python benchmarks/head_step.py --threads 2 --steps 4 --out /tmp/head_step.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_json  # noqa: E402
from semspec.draft.config import HeadTrainConfig  # noqa: E402
from semspec.draft.head_build import DRAFT_VOCAB  # noqa: E402
from semspec.draft.head_data import Trace  # noqa: E402
from semspec.draft.head_train import resolve_train_dtype, train_step  # noqa: E402
from semspec.head import HeadModel  # noqa: E402


def step_seconds(model, cfg: HeadTrainConfig, steps: int, length: int, prompt_len: int) -> list[float]:
    """Seconds of each of ``steps`` training steps (after one untimed warm-up step) of a fresh
    head on ``model`` under ``cfg`` (its dtype, batch size, unroll and loss)."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    traces = [Trace(torch.randint(0, vocab, (length,), generator=gen).tolist(), prompt_len, "greedy")
              for _ in range(cfg.batch_size)]
    states = [torch.randn(length, model.config.hidden_size, generator=gen).half() for _ in traces]
    w_sub = model.get_output_embeddings().weight[: min(DRAFT_VOCAB, vocab)].detach().float()
    head = HeadModel(model, layers=cfg.layers)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    seconds = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        train_step(head, w_sub, traces, states, cfg, gen, opt, params)
        seconds.append(time.perf_counter() - t0)
    return seconds[1:]


def measure(model, dtypes: list[str], steps: int, length: int, prompt_len: int, cfg: HeadTrainConfig) -> dict:
    out = {"auto_picks": resolve_train_dtype(cfg).train_dtype, "recipe_steps": cfg.last_step, "dtypes": {}}
    for dtype in dtypes:
        secs = step_seconds(model, dataclasses.replace(cfg, train_dtype=dtype), steps, length, prompt_len)
        median = statistics.median(secs)
        out["dtypes"][dtype] = {"seconds": secs, "median_s": median,
                                "recipe_training_min": median * cfg.last_step / 60}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="embedded:smollm2-135m")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per number type (after a warm-up step)")
    ap.add_argument("--length", type=int, default=270, help="tokens a trace (the build's are about 270 with padding)")
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--threads", type=int, default=HeadTrainConfig().threads)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from semspec.models.loaded import load_model

    target = load_model(args.target, device="cpu", dtype=torch.float32)
    for p in target.model.parameters():
        p.requires_grad_(False)
    cfg = HeadTrainConfig(threads=args.threads)
    result = measure(target.model, args.dtypes.split(","), args.steps, args.length, args.prompt_len, cfg)
    result.update(threads=args.threads, length=args.length, batch_size=cfg.batch_size)
    for dtype, r in result["dtypes"].items():
        print(f"{dtype}: {r['median_s']:.2f} s a step; the recipe's {result['recipe_steps']} steps "
              f"{r['recipe_training_min']:.0f} min", flush=True)
    print(f"train_dtype auto picks {result['auto_picks']} here")
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Few-row passes on a CPU: nn.Linear's weight layout against the transposed copy that
``semspec.cpu_linear`` keeps, measured in turns so that the machine's drift hits both.

1. Matrix products alone: 60 distinct [1536, 576] float32 matrices (more than the CPU's
   caches hold, as in a real pass) and the [49152, 576] LM head, for 1-8 rows.
2. The embedded target's decoding pass through the batched runner, 1-4 sequences of one
   token each, with the transposed copies on (``SMALL_ROWS`` as shipped) and off (0), and
   the same passes in bfloat16 (``semspec.models.BF16_MIN_BATCH`` is where it wins).

    python benchmarks/cpu_linear.py [--threads 1] [--turns 8] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from semspec import cpu_linear  # noqa: E402


def _ms(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1000


def _turns(a, b, turns: int, c=None) -> dict:
    """Median times of ``a``, ``b`` (and ``c``) run in turns, and the median of a/b."""
    ta, tb, tc = [], [], []
    for _ in range(turns):
        ta.append(a())
        tb.append(b())
        if c is not None:
            tc.append(c())
    out = {"linear_ms": statistics.median(ta), "transposed_ms": statistics.median(tb),
           "speedup": statistics.median(x / y for x, y in zip(ta, tb))}
    if c is not None:
        out["bfloat16_ms"] = statistics.median(tc)
    return out


def matmuls(turns: int) -> dict:
    mats = [torch.randn(1536, 576) for _ in range(60)]
    mats_t = [m.t().contiguous() for m in mats]
    head = torch.randn(49152, 576)
    head_t = head.t().contiguous()
    out = {}
    for rows in (1, 2, 3, 4, 8):
        x = torch.randn(rows, 576)
        out[f"60 layers, {rows} rows"] = _turns(lambda: _ms(lambda: [F.linear(x, m) for m in mats], 3),
                                                lambda: _ms(lambda: [x @ m for m in mats_t], 3), turns)
        out[f"LM head, {rows} rows"] = _turns(lambda: _ms(lambda: F.linear(x, head), 3),
                                              lambda: _ms(lambda: x @ head_t, 3), turns)
    return out


def decode_passes(turns: int, spec: str | None = None, cache_dir: str | None = None) -> dict:
    """Decoding passes of the model ``spec`` (None: the embedded target)."""
    from semspec.models import load_model
    from semspec.runner import Feed, ModelRunner

    runners = {}
    for dtype in (torch.float32, torch.bfloat16):
        runner = ModelRunner(load_model(spec, device="cpu", cache_dir=cache_dir, dtype=dtype), slots=4)
        runners[dtype] = (runner, [runner.alloc() for _ in range(4)])
    shipped = cpu_linear.SMALL_ROWS

    def pass_ms(n_seqs: int, small_rows: int, dtype=torch.float32) -> float:
        cpu_linear.SMALL_ROWS = small_rows
        runner, slots = runners[dtype]
        for s in slots[:n_seqs]:
            runner.set_length(s, 0)
        runner.forward([Feed(s, list(range(100, 160)), [59]) for s in slots[:n_seqs]])
        return _ms(lambda: runner.forward([Feed(s, [200], [0]) for s in slots[:n_seqs]]), 8)

    out = {}
    try:
        with torch.inference_mode():
            for n in (1, 2, 3, 4):
                out[f"{n} sequences"] = _turns(lambda: pass_ms(n, 0), lambda: pass_ms(n, shipped), turns,
                                               lambda: pass_ms(n, shipped, torch.bfloat16))
    finally:
        cpu_linear.SMALL_ROWS = shipped
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = {"threads": args.threads, "turns": args.turns, "small_rows": cpu_linear.SMALL_ROWS,
              "torch": torch.__version__, "matmuls": matmuls(args.turns), "decode_passes": decode_passes(args.turns)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

"""Few-row passes on a CPU: torch's nn.Linear kernel against the two copies
``semspec.cpu_linear`` can keep (the transposed weight read by torch's kernel, and the
packed weight read by its own C kernel), measured in turns so the machine's drift hits all.

1. Matrix products alone: 60 distinct [1536, 576] float32 matrices (more than the CPU's
   caches hold, as in a real pass) and the [49152, 576] LM head, for 1-512 rows.
2. The embedded target's passes through the batched runner: decoding passes of 1-8
   sequences (one token each) and verification passes of one sequence over 4-24 tokens.

Each layout is forced for a whole run of passes: ``linear`` reads no copy, ``transposed``
the transposed copy (its row limit as shipped), ``packed`` the packed copy (as shipped:
the build for this CPU's widest vectors) and, on a CPU with AVX-512, ``packed_avx2`` the
packed copy read by the AVX2 build (panels of 8), to show what the wider vectors add.

    python benchmarks/cpu_linear.py [--threads 1] [--turns 8] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from semspec import cpu_linear  # noqa: E402

LAYOUTS = ("linear", "transposed", "packed")


@lru_cache(maxsize=1)
def avx2_kernel() -> cpu_linear.Kernel:
    return cpu_linear.load_kernel(cpu_linear.AVX2_FLAGS)


def layouts() -> tuple[str, ...]:
    """The layouts this CPU can compare: the AVX2 build too where the shipped one is wider."""
    kernel = cpu_linear.packed_kernel()
    return LAYOUTS + (("packed_avx2",) if kernel is not None and kernel.panel != 8 else ())


def _ms(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1000


def _turns(fns: dict, turns: int) -> dict:
    """Median time of each of ``fns`` (name -> timed call, the first the baseline), run in
    turns, and each one's median speed-up over the baseline."""
    times = {name: [] for name in fns}
    for _ in range(turns):
        for name, fn in fns.items():
            times[name].append(fn())
    base = times[next(iter(fns))]
    out = {f"{name}_ms": statistics.median(t) for name, t in times.items()}
    for name, t in list(times.items())[1:]:
        out[f"{name}_speedup"] = statistics.median(b / x for b, x in zip(base, t))
    return out


@contextmanager
def layout(name: str):
    """Every SmallRowsLinear reads ``name``'s layout inside the block."""
    kernel, transposed_rows = cpu_linear.packed_kernel, cpu_linear.TRANSPOSED_ROWS
    if name == "packed_avx2":
        cpu_linear.packed_kernel = avx2_kernel
    elif name != "packed":
        cpu_linear.packed_kernel = lambda: None
    if name == "linear":
        cpu_linear.TRANSPOSED_ROWS = 0
    try:
        yield
    finally:
        cpu_linear.packed_kernel, cpu_linear.TRANSPOSED_ROWS = kernel, transposed_rows


def matmuls(turns: int) -> dict:
    mats = [torch.randn(1536, 576) for _ in range(60)]
    head = torch.randn(49152, 576)
    names = layouts()
    kernels = {"packed": cpu_linear.packed_kernel(), "packed_avx2": avx2_kernel() if "packed_avx2" in names else None}
    copies = {"transposed": ([m.t().contiguous() for m in mats], head.t().contiguous())}
    for name in names[2:]:
        panel = kernels[name].panel
        copies[name] = ([cpu_linear.pack(m, panel) for m in mats], cpu_linear.pack(head, panel))

    def product(name, x, w, i=None):
        if name == "linear":
            return F.linear(x, w)
        c = copies[name][0][i] if i is not None else copies[name][1]
        return x @ c if name == "transposed" else cpu_linear.packed_matmul(x, c, w.shape[0], kernels[name])

    out = {}
    for rows in (1, 2, 3, 4, 8, 16, 32, 64, 128, 512):  # 64 and on: verifications of a batch, prefills
        x = torch.randn(rows, 576)
        out[f"60 layers, {rows} rows"] = _turns(
            {n: (lambda n=n: _ms(lambda: [product(n, x, m, i) for i, m in enumerate(mats)], 3)) for n in names},
            turns)
        out[f"LM head, {rows} rows"] = _turns({n: (lambda n=n: _ms(lambda: product(n, x, head), 3)) for n in names},
                                              turns)
    return out


def model_passes(turns: int, spec: str | None = None, cache_dir: str | None = None) -> dict:
    """Decoding and verification passes of the model ``spec`` (None: the embedded target)."""
    from semspec.models import load_model
    from semspec.runner import Feed, ModelRunner

    runner = ModelRunner(load_model(spec, device="cpu", cache_dir=cache_dir, dtype=torch.float32), slots=8)
    slots = [runner.alloc() for _ in range(8)]

    def pass_ms(name: str, n_seqs: int, n_tokens: int) -> float:
        def one():
            for s in slots[:n_seqs]:
                runner.set_length(s, 60)
            runner.forward([Feed(s, list(range(200, 200 + n_tokens)), [n_tokens - 1]) for s in slots[:n_seqs]])
        with layout(name):
            return _ms(one, 6)

    names = layouts()
    with torch.inference_mode():
        runner.forward([Feed(s, list(range(100, 160)), [59]) for s in slots])  # a 60-token prompt in each
        shapes = [(n, 1) for n in (1, 2, 3, 4, 8)] + [(1, t) for t in (4, 8, 16, 24)]
        return {f"{n} sequences x {t} tokens": _turns({name: (lambda name=name: pass_ms(name, n, t)) for name in names},
                                                      turns)
                for n, t in shapes}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if cpu_linear.packed_kernel() is None:
        sys.exit("the packed kernel is unavailable here (see the log): nothing to compare")
    result = {"threads": args.threads, "turns": args.turns, "packed_rows": cpu_linear.fast_rows(),
              "transposed_rows": cpu_linear.TRANSPOSED_ROWS, "torch": torch.__version__,
              "matmuls": matmuls(args.turns), "passes": model_passes(args.turns)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

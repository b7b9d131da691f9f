"""How long the vLLM engine takes to start, and how fast it then decodes, by number type and
graph mode (issue #33: choose the defaults by measurement). One process per combination,
each: start VLLMEngine (warm model cache), then 32 GSM8K questions (test lines 101-132),
greedy, 128 tokens, 32 in flight, one torch thread.

    python benchmarks/vllm_startup.py --out docs/benchmarks/vllm_startup.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

COMBOS = [("float32", False), ("bfloat16", False), ("float32", True), ("bfloat16", True)]


def one(dtype: str, compile: bool) -> dict:
    import torch

    torch.set_num_threads(1)
    from _common import GSM8K

    from semspec.types import GenerationConfig
    from semspec.engine.token_engine import VLLMEngine

    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()[100:132]]
    t0 = time.perf_counter()
    engine = VLLMEngine.load(dtype=dtype, batch_size=32, compile=compile)
    start = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = list(engine.generate_many(questions, GenerationConfig(method="ar", max_new_tokens=128), batch_size=32))
    wall = time.perf_counter() - t0
    tokens = sum(d.result.counters.generated_tokens for d in done)
    return {"dtype": dtype, "compile": compile, "start_s": round(start, 1), "tokens_per_s": round(tokens / wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--one", nargs=2, metavar=("DTYPE", "COMPILE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one(a.one[0], a.one[1] == "1")))
        return
    rows = []
    for dtype, compile in COMBOS:
        out = subprocess.run([sys.executable, __file__, "--one", dtype, "1" if compile else "0"],
                             capture_output=True, text=True, cwd=Path(__file__).parent)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        row = json.loads(line[7:]) if line else {"dtype": dtype, "compile": compile, "error": out.stderr[-500:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""What semspec's writer costs a call: every call of the target's own writing (the writer
engine, speculating tokens with the shipped head) that semspec makes on the first N GSM8K test
questions, batch 1, T 0.6, seed i for question i; seconds against tokens, and the least-squares
line through them (a fixed part per request, the re-entry that semspec.adaptive weighs, and a
cost per token).

    python benchmarks/writer_calls.py --limit 8 --out docs/benchmarks/writer_calls/avx2.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import numpy as np
    from _common import GSM8K, write_json

    from semspec.engine.step_engine import VLLMStepEngine
    from semspec.types import GenerationConfig

    class Recording(VLLMStepEngine):
        calls: list[tuple[float, int]] = []

        def _measure(self, call, served, seconds, tokens):
            if served is self.writer:
                self.calls.append((seconds, tokens))
            super()._measure(call, served, seconds, tokens)

    engine = Recording.load(device="cpu", batch_size=1)
    Recording.calls.clear()  # (the load's warm-up)
    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()[:args.limit]]
    for i, question in enumerate(questions):
        engine.generate(question, GenerationConfig(method="semspec", temperature=0.6, seed=i, max_new_tokens=256))
    seconds = np.array([s for s, _ in Recording.calls])
    tokens = np.array([t for _, t in Recording.calls], dtype=float)
    fixed, per_token = np.linalg.lstsq(np.stack([np.ones_like(tokens), tokens], 1), seconds, rcond=None)[0]
    write_json({"questions": args.limit, "calls": len(seconds), "tokens": int(tokens.sum()),
                          "seconds": float(seconds.sum()), "fixed_seconds_per_call": float(fixed),
                          "seconds_per_token": float(per_token),
                          "mean_seconds_per_token": float(seconds.sum() / tokens.sum()),
                          "calls_seconds_tokens": Recording.calls}, args.out)


if __name__ == "__main__":
    main()

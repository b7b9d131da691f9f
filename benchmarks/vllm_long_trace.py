"""Memory is a budget: one very long trace among short ones on the vLLM engine.

One engine process's view of a job (issue #33): 32 in flight, 31 GSM8K questions answered in
at most 256 tokens and one sample asked to run to LONG tokens (a prompt that makes SmolLM2
repeat itself; its output is cut at the limit), within a KV budget of --kv-cache-gb. Prints
the peak resident memory of this process (the engine runs in it) and whether every sample is
intact: each short sample's text equals its text from a batch of the short ones only (float32,
greedy), and the long one ran to its limit.

    python benchmarks/vllm_long_trace.py --long 6000 --kv-cache-gb 2 --out docs/benchmarks/vllm_long_trace.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

LONG_PROMPT = "Write the numbers from one to ten thousand in words, one per line, and nothing else."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", type=int, default=6000, help="tokens the long sample runs to")
    ap.add_argument("--short", type=int, default=256, help="tokens each short sample may use")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--kv-cache-gb", type=float, default=2.0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from _common import GSM8K

    from semspec.types import GenerationConfig, Request
    from semspec.engine.token_engine import VLLMEngine

    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()[100:100 + a.batch_size - 1]]
    t0 = time.perf_counter()
    engine = VLLMEngine.load(dtype=a.dtype, batch_size=a.batch_size, kv_cache_gb=a.kv_cache_gb)
    started = time.perf_counter() - t0
    short = GenerationConfig(method="ar", max_new_tokens=a.short)
    long = GenerationConfig(method="ar", max_new_tokens=a.long)
    requests = [Request(LONG_PROMPT, long, key="long")] + [Request(q, short, key=i) for i, q in enumerate(questions)]
    t0 = time.perf_counter()
    results = {}
    for done in engine.generate_many(requests, batch_size=a.batch_size):
        if done.error is not None:
            raise SystemExit(f"sample {done.key} failed: {done.error}")
        results[done.key] = done.result
    wall = time.perf_counter() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    alone = {d.key: d.result.text for d in engine.generate_many(questions, short, batch_size=a.batch_size)}
    intact = sum(results[i].text == alone[i] for i in alone)
    figures = {
        "long_sample_tokens": results["long"].counters.generated_tokens,
        "long_finish_reason": results["long"].finish_reason,
        "short_samples": len(questions), "short_samples_identical_to_alone": intact,
        "generated_tokens": sum(r.counters.generated_tokens for r in results.values()),
        "wall_s": round(wall, 1), "engine_start_s": round(started, 1),
        "peak_rss_gb": round(peak_gb, 2), "kv_cache_gb": a.kv_cache_gb, "dtype": engine.dtype,
        "batch_size": a.batch_size, "torch_threads": a.threads, "engine": engine.identities["engine"],
    }
    print(json.dumps(figures, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()

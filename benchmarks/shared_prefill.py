"""What sharing a prompt's prefill saves when each input is sampled N times: the same
requests (N samples of each GSM8K question, each with its own seed as the service gives
them) decoded by the batched engine with prompt-prefix sharing on and off, in ONE process,
alternating the two so that load from other processes hits both alike.

    python benchmarks/shared_prefill.py --questions 50 --n 4 --max-new-tokens 128 --threads 1

Reported per setting: generated tokens / wall seconds, prompt tokens the target was fed and
copied, the target's prefill share of its pass time, and whether both settings produced the
same texts (they should: a copied prefix holds the values a prefill would have computed,
up to the rounding of a differently shaped pass).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from jobs.submit import sample_seed
from semspec.assets import GSM8K_TEST
from semspec.engine import Engine
from semspec.scheduler import PassStats
from semspec.types import SAMPLING_TEMPERATURE, SAMPLING_TOP_P, GenerationConfig, Request


def requests(questions: int, n: int, max_new_tokens: int) -> list[Request]:
    with open(GSM8K_TEST) as f:
        qs = [json.loads(line)["question"] for _, line in zip(range(questions), f)]
    return [Request(q, GenerationConfig(method="ar", max_new_tokens=max_new_tokens,
                                        temperature=SAMPLING_TEMPERATURE, top_p=SAMPLING_TOP_P,
                                        seed=sample_seed(0, f"gsm8k-{i}", s)), key=(i, s))
            for i, q in enumerate(qs) for s in range(n)]


def run(engine: Engine, reqs: list[Request], batch_size: int, share: bool) -> dict:
    stats = PassStats()
    t0 = time.perf_counter()
    done = {d.key: d.result for d in engine.generate_many(reqs, batch_size=batch_size, stats=stats,
                                                           share_prefixes=share)}
    wall = time.perf_counter() - t0
    gen = sum(r.counters.generated_tokens for r in done.values())
    return {
        "texts": {k: r.text for k, r in done.items()},
        "wall_s": round(wall, 2),
        "generated_tokens": gen,
        "tokens_per_s": round(gen / wall, 2),
        "prefill_tokens_fed": stats.target.get("prefill_tokens", 0),
        "prefix_tokens_copied": stats.target.get("shared_prefix_tokens", 0),
        "target_passes": stats.target["passes"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1, help="on/off pairs, alternating")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine.load(batch_size=args.batch_size)
    reqs = requests(args.questions, args.n, args.max_new_tokens)
    runs: dict[str, list[dict]] = {"shared": [], "unshared": []}
    for r in range(args.rounds):
        order = ("shared", "unshared") if r % 2 == 0 else ("unshared", "shared")
        for name in order:
            runs[name].append(run(engine, reqs, args.batch_size, name == "shared"))
    report = {"settings": vars(args), "dtype": str(engine.target.dtype)}
    for name, rs in runs.items():
        report[name] = {k: v for k, v in rs[-1].items() if k != "texts"}
        report[name]["tokens_per_s_each_round"] = [x["tokens_per_s"] for x in rs]
    a, b = runs["shared"][-1]["texts"], runs["unshared"][-1]["texts"]
    report["same_text_share"] = round(sum(a[k] == b[k] for k in a) / len(a), 4)
    report["speedup_shared_vs_unshared"] = round(
        sum(x["tokens_per_s"] for x in runs["shared"]) / sum(x["tokens_per_s"] for x in runs["unshared"]), 3)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

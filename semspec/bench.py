"""Per-method figures on GSM8K prompts, measured in one run (a tool, not part of the engine).

    python -m semspec.bench --prompts /work/shared/data/gsm8k_test.jsonl -n 10 \\
        --max-new-tokens 128 --truncated-draft 8 --probes accept --out bench.json

Reports per method: output tokens/s (generated tokens / wall seconds, prefill included),
target forward passes per generated token, token acceptance (accepted / drafted draft
tokens), step acceptance (accepted / drafted steps), mean accepted tokens per verification
pass (token_sd: accepted drafted tokens / verification passes, bonus token NOT included),
exact agreement with ``ar`` (identical text) and answer accuracy against the references.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from .engine import Engine
from .models import load_model, truncated_copy
from .probes import ProbePair
from .steps import extract_answer
from .types import METHODS, GenerationConfig


def load_prompts(path: str, n: int, offset: int = 0) -> list[dict]:
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i < offset:
                continue
            rec = json.loads(line)
            q = rec.get("question") or rec.get("prompt")
            ref = extract_answer(rec.get("answer", "")) if rec.get("answer") else None
            out.append({"prompt": q, "reference": ref})
            if len(out) >= n:
                break
    return out


def summarize(method: str, results: list, prompts: list[dict], ar_texts: list[str] | None) -> dict:
    gen = sum(r.counters.generated_tokens for r in results)
    wall = sum(r.wall_seconds for r in results)
    tp = sum(r.counters.target_forward_passes for r in results)
    dp = sum(r.counters.draft_forward_passes for r in results)
    drafted = sum(r.counters.drafted_tokens for r in results)
    accepted = sum(r.counters.accepted_tokens for r in results)
    sd = sum(r.counters.steps_drafted for r in results)
    sa = sum(r.counters.steps_accepted for r in results)
    phases: dict[str, float] = {}
    for r in results:
        for k, v in r.counters.phase_seconds.items():
            phases[k] = phases.get(k, 0.0) + v
    refs = [p["reference"] for p in prompts]
    correct = sum(1 for r, ref in zip(results, refs) if ref is not None and r.final_answer == ref)
    row = {
        "method": method,
        "prompts": len(results),
        "generated_tokens": gen,
        "wall_seconds": round(wall, 2),
        "tokens_per_second": round(gen / wall, 2) if wall else None,
        "target_passes": tp,
        "target_passes_per_token": round(tp / gen, 3) if gen else None,
        "draft_passes": dp,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "token_acceptance": round(accepted / drafted, 3) if drafted else None,
        "steps_drafted": sd,
        "steps_accepted": sa,
        "step_acceptance": round(sa / sd, 3) if sd else None,
        "answers_correct": correct,
        "answers_with_reference": sum(1 for x in refs if x is not None),
        "phase_seconds": {k: round(v, 2) for k, v in phases.items()},
    }
    if method.startswith("token_sd"):
        verif = tp - len(results)  # minus one prefill per prompt
        row["accepted_per_verification_excl_bonus"] = round(accepted / verif, 3) if verif else None
    if ar_texts is not None:
        row["identical_to_ar"] = sum(1 for r, t in zip(results, ar_texts) if r.text == t)
    return row


def hf_rows(target, draft, prompts: list[dict], max_new_tokens: int) -> list[dict]:
    """transformers' own greedy decoding (and assisted decoding with the same draft), timed
    the same way, for reference."""
    from .models import encode_prompt

    rows = []
    for name, kwargs in [("hf_generate", {}), ("hf_assisted", {"assistant_model": draft.model if draft else None})]:
        if name == "hf_assisted" and draft is None:
            continue
        gen = 0
        t0 = time.perf_counter()
        for p in prompts:
            ids = torch.tensor([encode_prompt(target.tokenizer, p["prompt"])], device=target.device)
            with torch.no_grad():
                out = target.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
            gen += out.shape[1] - ids.shape[1]
        wall = time.perf_counter() - t0
        rows.append({"method": name, "prompts": len(prompts), "generated_tokens": gen,
                     "wall_seconds": round(wall, 2), "tokens_per_second": round(gen / wall, 2)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="/work/shared/data/gsm8k_test.jsonl")
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None, help="draft model spec")
    ap.add_argument("--truncated-draft", type=int, default=None, help="draft = target's first K layers")
    ap.add_argument("--probes", default=None,
                    help="';'-separated probe sets, each a probe dir, accept, reject or const:<p_T>,<p_D>")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-step-tokens", type=int, default=64)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--step-delimiter", default="\n\n", help="e.g. '\\n' (escapes are decoded)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("--hf-compare", action="store_true",
                    help="also time transformers' greedy generate, and generate(assistant_model=draft)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    target = load_model(args.target, cache_dir=args.cache_dir)
    draft = None
    if args.truncated_draft:
        draft = truncated_copy(target, args.truncated_draft)
    elif args.draft:
        draft = load_model(args.draft, cache_dir=args.cache_dir)
    probe_sets: dict[str, ProbePair] = {}
    if args.probes and draft is not None:
        th, dh = target.hidden_size, draft.hidden_size
        for spec in args.probes.split(";"):
            if spec == "accept":
                probe_sets[spec] = ProbePair.always_accept(th, dh)
            elif spec == "reject":
                probe_sets[spec] = ProbePair.always_reject(th, dh)
            elif spec.startswith("const:"):
                a, b = (float(x) for x in spec[6:].split(","))
                probe_sets[spec] = ProbePair.constant(a, b, th, dh)
            else:
                probe_sets[spec] = ProbePair.load(spec, target, draft)
    first = next(iter(probe_sets.values()), None)
    engine = Engine(target, draft, first)
    prompts = load_prompts(args.prompts, args.n, args.offset)
    runs = []
    for m in (x for x in args.methods.split(",") if x):
        if m == "semspec":
            runs += [(f"semspec[{k}]" if len(probe_sets) > 1 or k in ("accept", "reject") else m, p)
                     for k, p in probe_sets.items()]
        else:
            runs.append((m, first))
    report = {"models": engine.identities, "settings": vars(args), "torch_threads": torch.get_num_threads(),
              "rows": [], "samples": {}}
    ar_texts = None
    for name, pset in runs:
        method = name.split("[")[0]
        if method != "ar" and draft is None:
            continue
        engine = Engine(target, draft, pset)
        cfg = GenerationConfig(method=method, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                               top_p=args.top_p, seed=args.seed, max_step_tokens=args.max_step_tokens,
                               draft_tokens=args.draft_tokens,
                               step_delimiter=args.step_delimiter.encode().decode("unicode_escape"))
        t0 = time.perf_counter()
        results = [engine.generate(p["prompt"], cfg) for p in prompts]
        row = summarize(name, results, prompts, ar_texts if method != "ar" else None)
        row["run_seconds"] = round(time.perf_counter() - t0, 2)
        if method == "ar":
            ar_texts = [r.text for r in results]
        report["rows"].append(row)
        report["samples"][name] = [
            {"text": results[0].text, "final_answer": results[0].final_answer,
             "steps": [(s.author, s.decision, s.text) for s in results[0].steps[:6]]}
        ]
        print(json.dumps(row), flush=True)
    if args.hf_compare:
        report["rows"] += hf_rows(target, draft, prompts, args.max_new_tokens)
        for row in report["rows"][-2:]:
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

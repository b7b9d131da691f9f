"""Measure the embedded draft against its target in ONE run, same thread count.

    python benchmarks/draft_cost.py --prompts 10 --out docs/draft_cost.json

Figures (all on the first ``--prompts`` GSM8K test questions, the benchmark slice the draft
never trained on):
- cost: KV-cached greedy decode, one token at a time; target step and draft step are timed
  alternately (step i of the target, then step i of the draft) so that load from other
  processes hits both alike. Reported: per-token ms (median, mean) and the ratio draft/target
  (ratio of medians, and median of the per-pair ratios). Prefill is excluded.
- token-level greedy speculation, gamma drafted tokens per verification: the target's greedy
  answers are generated once (batched), the draft runs one teacher-forced pass over each, and
  the counters of the greedy loop are derived exactly from those predictions (with greedy
  verification the committed text is the target's greedy text, so each proposal is the
  draft's prediction on the target's prefix). Reported: drafted, accepted (bonus excluded),
  verifications, acceptance rate = accepted/drafted, mean accepted per verification with and
  without the bonus token. On ``--spec-prompts`` prompts the real loop (``speculate``: draft
  proposes, target verifies in one pass, KV caches cropped) also runs, for its wall-clock
  speed-up over the target alone, its equality with the target's greedy output and its
  agreement with the simulated counters.
- drafted steps: at a few step boundaries of the target's own answer, the draft's greedy
  next step beside the target's.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from semspec.assets import GSM8K_TEST


def load_pair(target_spec: str, draft_spec: str | None, artifact: str | None):
    """(target, draft) as LoadedModel; ``artifact`` builds the draft in memory instead."""
    from semspec.models.identity import ModelIdentity
    from semspec.models.loaded import LoadedModel, load_model

    target = load_model(target_spec, device="cpu", dtype=torch.float32)
    if artifact:
        from semspec.models.draft_artifact import build_draft_model, load_artifact
        from semspec.models.embedded_draft import artifact_sha256

        art = load_artifact(artifact)
        draft = LoadedModel(model=build_draft_model(target.model, art),
                            tokenizer=target.tokenizer,
                            identity=ModelIdentity(f"artifact:{artifact}", artifact_sha256(artifact)),
                            device=target.device, dtype=target.dtype, spec=f"artifact:{artifact}",
                            vocab_ids=art.vocab_ids)
    else:
        draft = load_model(draft_spec, device="cpu", dtype=torch.float32)
    return target, draft


def questions(path: str, n: int) -> list[str]:
    out = []
    with open(path) as fh:
        for line in fh:
            out.append(json.loads(line)["question"])
            if len(out) == n:
                break
    return out


@torch.inference_mode()
def run(lm, ids: list[int], cache, last_only: bool = False) -> torch.Tensor:
    """Logits [rows, V] of one pass of ``ids`` through a LoadedModel, as calibration runs it
    (a reduced-vocabulary draft computes only its own rows of the LM head)."""
    return lm.forward(torch.tensor([ids]), cache, False, 1 if last_only else 0)[0]


def new_cache(lm):
    from transformers import DynamicCache

    return DynamicCache(config=lm.model.config)


@torch.inference_mode()
def prefill(lm, ids: list[int]):
    cache = new_cache(lm)
    return cache, int(run(lm, ids, cache, last_only=True)[-1].argmax())


@torch.inference_mode()
def step(lm, cache, tok: int):
    return int(run(lm, [tok], cache, last_only=True)[-1].argmax())


@torch.inference_mode()
def cost_pairs(target, draft, prompt: list[int], n: int) -> list[tuple[float, float]]:
    tc, tt = prefill(target, prompt)
    dc, dt = prefill(draft, prompt)
    pairs = []
    for _ in range(n):
        t0 = time.perf_counter()
        tt = step(target, tc, tt)
        t1 = time.perf_counter()
        dt = step(draft, dc, dt)
        t2 = time.perf_counter()
        pairs.append((t1 - t0, t2 - t1))
    return pairs


@torch.inference_mode()
def greedy(model, prompt: list[int], max_new: int, eos: set[int]) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    cache, tok = prefill(model, prompt)
    out = [tok]
    while len(out) < max_new and tok not in eos:
        tok = step(model, cache, tok)
        out.append(tok)
    return out, time.perf_counter() - t0


def _crop(cache, keep: int) -> None:
    """Keep the first ``keep`` positions of a KV cache."""
    n = cache.get_seq_length()
    if n > keep:
        cache.crop(keep - n)  # this transformers takes the number of positions to drop, negated


@torch.inference_mode()
def speculate(target, draft, prompt: list[int], max_new: int, gamma: int, eos: set[int]) -> dict:
    """Greedy token-level speculative decoding; returns tokens and raw counters."""
    t0 = time.perf_counter()
    tc, nxt = prefill(target, prompt)  # target cache covers the prompt; nxt is committed
    dc = new_cache(draft)
    if len(prompt) > 1:
        run(draft, prompt[:-1], dc, last_only=True)
    d_len = len(prompt) - 1  # tokens in the draft cache
    seq = list(prompt) + [nxt]
    out = [nxt]
    drafted = accepted = verifications = 0
    per_verification = []
    while len(out) < max_new and out[-1] not in eos:
        # Draft: feed what the draft cache lacks, then propose gamma tokens.
        g = min(gamma, max_new - len(out))
        feed = seq[d_len:]
        proposal = [int(run(draft, feed, dc, last_only=True)[-1].argmax())]
        d_len += len(feed)
        while len(proposal) < g:
            proposal.append(step(draft, dc, proposal[-1]))
            d_len += 1
        # Verify: the target scores [last committed token] + proposal in one pass.
        vlog = run(target, [seq[-1]] + proposal, tc)
        want = vlog.argmax(-1).tolist()  # want[i] = target's token after proposal[:i]
        n_ok = 0
        while n_ok < len(proposal) and proposal[n_ok] == want[n_ok]:
            n_ok += 1
        new = proposal[:n_ok] + [want[n_ok]]
        drafted += len(proposal)
        accepted += n_ok
        verifications += 1
        per_verification.append(n_ok)
        for tok in new:
            seq.append(tok)
            out.append(tok)
            if tok in eos or len(out) >= max_new:
                break
        # Roll back both caches to the committed sequence (minus its last token).
        _crop(tc, len(seq) - 1)
        d_keep = min(d_len, len(seq) - 1)
        _crop(dc, d_keep)
        d_len = d_keep
    return {"tokens": out, "seconds": time.perf_counter() - t0, "drafted": drafted, "accepted": accepted,
            "verifications": verifications, "accepted_per_verification": per_verification}


@torch.inference_mode()
def draft_predictions(draft, prompt: list[int], continuation: list[int]) -> list[int]:
    """pred[i] = the draft's greedy token after prompt + continuation[:i] (one forward pass)."""
    logits = run(draft, prompt + continuation[:-1], new_cache(draft))
    return logits[len(prompt) - 1:].argmax(-1).tolist()


def simulate_greedy_sd(pred: list[int], cont: list[int], gamma: int, max_new: int) -> dict:
    """Counters of greedy token-level speculation, derived exactly from teacher-forced draft
    predictions: with greedy verification the committed text is the target's greedy text, so
    the draft's k-th proposal after an accepted run is its prediction on the target's prefix.
    Follows ``speculate``: token 0 comes from the target's prefill; each verification drafts
    min(gamma, tokens left) tokens and commits the agreeing prefix plus one target token."""
    n = len(cont)
    i = 1
    drafted = accepted = ver = 0
    per = []
    while i < n:
        g = min(gamma, max_new - i)
        a = 0
        while a < g and i + a < n and pred[i + a] == cont[i + a]:
            a += 1
        drafted += g
        accepted += a
        ver += 1
        per.append(a)
        i += a + 1
    return {"drafted": drafted, "accepted": accepted, "verifications": ver, "accepted_per_verification": per}


@torch.inference_mode()
def draft_step(model, ids: list[int], tokenizer, cap: int, eos: set[int]) -> str:
    cache, tok = prefill(model, ids)
    out = [tok]
    while len(out) < cap and tok not in eos:
        if "\n\n" in tokenizer.decode(out):
            break
        tok = step(model, cache, tok)
        out.append(tok)
    text = tokenizer.decode(out, skip_special_tokens=True)
    return text.split("\n\n")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="embedded:smollm2-135m")
    ap.add_argument("--draft", default="embedded:smollm2-135m-draft")
    ap.add_argument("--artifact", default=None, help="a draft artifact dir instead of --draft")
    ap.add_argument("--data", default=str(GSM8K_TEST))
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--cost-tokens", type=int, default=16, help="decode steps timed per prompt and model")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--spec-prompts", type=int, default=2, help="prompts also run through the real loop")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--step-examples", type=int, default=3, help="prompts whose steps are shown")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write JSON here (and .md beside it)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    from semspec.prompts import encode_prompt

    target, draft_lm = load_pair(args.target, args.draft, args.artifact)
    draft, draft_name = draft_lm, str(draft_lm.identity)
    tok = target.tokenizer
    eos = target.eos_token_ids
    qs = questions(args.data, args.prompts)
    prompts = [encode_prompt(tok, q) for q in qs]

    from semspec.draft.data import generate_sequences

    # 1. Cost: target and draft decode steps, alternately timed.
    pairs = []
    for p in prompts:
        pairs += cost_pairs(target, draft, p, args.cost_tokens)
    print(f"cost: {len(pairs)} step pairs", flush=True)

    # 2. The target's greedy answers (batched), then the draft's predictions on them.
    t0 = time.perf_counter()
    gen = generate_sequences(target.model, tok, qs, args.max_new_tokens, batch_size=len(qs))
    print(f"target greedy answers: {time.perf_counter() - t0:.0f}s", flush=True)
    conts = [s.ids[s.prompt_len:] for s in gen]
    sim_rows, top1 = [], [0, 0]
    for i, (p, c) in enumerate(zip(prompts, conts)):
        pred = draft_predictions(draft, p, c)
        top1[0] += sum(int(a == b) for a, b in zip(pred, c))
        top1[1] += len(c)
        row = simulate_greedy_sd(pred, c, args.gamma, args.max_new_tokens)
        row.update({"prompt": i, "tokens": len(c)})
        sim_rows.append(row)

    # 3. The real loop on a few prompts: wall-clock against the target alone, and a check that
    #    its output and counters match the simulation.
    spec_rows = []
    for i, p in enumerate(prompts[: args.spec_prompts]):
        ref, ar_s = greedy(target, p, args.max_new_tokens, eos)
        sp = speculate(target, draft, p, args.max_new_tokens, args.gamma, eos)
        sp.update({"prompt": i, "ar_seconds": ar_s, "equal_to_ar": sp["tokens"] == ref,
                   "ar_tokens": len(ref), "matches_simulation": sp["accepted"] == sim_rows[i]["accepted"]})
        spec_rows.append(sp)
        print(f"prompt {i}: {len(ref)} tokens, accepted {sp['accepted']}/{sp['drafted']}, "
              f"spec {sp['seconds']:.2f}s vs ar {ar_s:.2f}s, equal={sp['equal_to_ar']}", flush=True)

    # 4. Drafted steps beside the target's own.
    examples = []
    for i in range(min(args.step_examples, len(qs))):
        text = tok.decode(conts[i], skip_special_tokens=True)
        shown, prefix = [], ""
        for j, part in enumerate(text.split("\n\n")[:3]):
            ids = prompts[i] + (tok(prefix, add_special_tokens=False)["input_ids"] if prefix else [])
            shown.append({"step": j, "target": part, "draft": draft_step(draft, ids, tok, 64, eos)})
            prefix += part + "\n\n"
        examples.append({"prompt": i, "question": qs[i], "steps": shown})

    t_ms = [a * 1e3 for a, _ in pairs]
    d_ms = [b * 1e3 for _, b in pairs]
    drafted = sum(r["drafted"] for r in sim_rows)
    accepted = sum(r["accepted"] for r in sim_rows)
    ver = sum(r["verifications"] for r in sim_rows)
    res = {
        "environment": {"threads": torch.get_num_threads(), "torch": torch.__version__,
                        "cpu": platform.processor() or platform.machine(), "target": str(target.identity),
                        "draft": draft_name, "draft_layers": draft.num_layers,
                        "prompts": args.prompts},
        "cost": {
            "target_ms_median": statistics.median(t_ms), "draft_ms_median": statistics.median(d_ms),
            "target_ms_mean": statistics.fmean(t_ms), "draft_ms_mean": statistics.fmean(d_ms),
            "ratio_of_medians": statistics.median(d_ms) / statistics.median(t_ms),
            "median_pair_ratio": statistics.median(b / a for a, b in pairs),
            "pairs": len(pairs),
        },
        "token_sd_greedy": {
            "how": "simulated exactly from one teacher-forced draft pass over the target's greedy answer",
            "gamma": args.gamma, "drafted": drafted, "accepted": accepted, "verifications": ver,
            "acceptance_rate": accepted / max(drafted, 1),
            "mean_accepted_per_verification_excl_bonus": accepted / max(ver, 1),
            "mean_tokens_per_verification_incl_bonus": (accepted + ver) / max(ver, 1),
            "draft_top1_agreement": top1[0] / max(top1[1], 1),
            "target_tokens": top1[1],
            "per_prompt": sim_rows,
        },
        "token_sd_greedy_loop": {
            "prompts": len(spec_rows),
            "all_equal_to_ar": all(r["equal_to_ar"] for r in spec_rows),
            "all_match_simulation": all(r["matches_simulation"] for r in spec_rows),
            "speedup_wall_median": statistics.median(r["ar_seconds"] / r["seconds"] for r in spec_rows) if spec_rows else None,
            "per_prompt": [{k: v for k, v in r.items() if k != "tokens"} for r in spec_rows],
        },
        "step_examples": examples,
    }
    summary = {k: res["cost"][k] for k in ("target_ms_median", "draft_ms_median", "ratio_of_medians", "median_pair_ratio")}
    summary.update({k: res["token_sd_greedy"][k] for k in ("acceptance_rate", "mean_accepted_per_verification_excl_bonus",
                                                          "mean_tokens_per_verification_incl_bonus", "draft_top1_agreement")})
    summary.update({f"loop_{k}": v for k, v in res["token_sd_greedy_loop"].items() if k != "per_prompt"})
    print(json.dumps(summary, indent=1))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1) + "\n")
        md = ["# Draft vs target", "", "```", json.dumps(summary, indent=1), "```", ""]
        for ex in examples:
            md += [f"## Prompt {ex['prompt']}: {ex['question']}", ""]
            for s in ex["steps"]:
                md += [f"**step {s['step']}** target: {s['target']!r}", "", f"draft: {s['draft']!r}", ""]
        out.with_suffix(".md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()

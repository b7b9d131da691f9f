"""The bench's figures, derived from raw per-run records (plain dicts, see ``runner.run_record``).

Nothing here measures anything: it only counts and divides, so every figure can be recomputed
from ``results.json``'s per-prompt records. Definitions are in :data:`DEFINITIONS`.
"""

from __future__ import annotations

import statistics
from typing import Any

from semspec.answers import is_correct

DEFINITIONS: dict[str, str] = {
    "speedup_vs_ar": "median over prompts of ar wall-clock / method wall-clock (same prompt, same run)",
    "speedup_vs_ar_mean": "mean over prompts of the same per-prompt ratio",
    "speedup_vs_ar_per_token": "median over prompts of ar's wall-clock per generated token / the method's "
                               "(same prompt, same run): the speed-up without the length of the answer, "
                               "which differs between methods whenever they sample or change the text",
    "tokens_per_second": "generated target tokens / wall-clock seconds, summed over prompts (prefill included)",
    "target_passes_per_token": "target forward passes (prefill, verification, judging and decode passes) "
                               "/ generated tokens",
    "draft_time_share": "time in the draft (engine 'draft' phase; hf_assisted: the assistant model's "
                        "forward calls) / wall-clock",
    "token_acceptance_rate": "accepted drafted tokens / drafted tokens (draft-tokenizer tokens; hf_assisted: "
                             "estimated, drafted = assistant forward calls, accepted = generated - target passes)",
    "mean_accepted_length": "accepted drafted tokens per verification pass, bonus token NOT counted "
                            "(token_sd: per target pass after the prefill; step methods: per drafted step)",
    "mean_accepted_length_incl_bonus": "the same plus the one token the target adds from each verification "
                                       "pass (token_sd, hf_assisted)",
    "step_acceptance_rate": "drafted steps accepted / drafted steps (step_judge, semspec)",
    "answer_agreement_vs_ar": "fraction of prompts whose final answer equals ar's (same prompt, same seed); "
                              "'no answer found' counts as an answer of its own",
    "identical_to_ar": "fraction of prompts whose whole output text equals ar's (greedy lossless methods: 1.0)",
    "accuracy": "fraction of prompts whose final answer is the reference (GSM8K: after ####), "
                "checked by semspec.answers.is_correct (math-verify, 1/2 = 0.5)",
    "answers_found": "fraction of prompts with an extractable final answer",
    "output_length_vs_ar": "total generated tokens / ar's total generated tokens",
    "output_length_vs_ar_median": "median over prompts of generated tokens / ar's generated tokens",
    "target_mean_loglik": "mean over prompts of the target's mean per-token log-likelihood of the output "
                          "(one untimed teacher-forced target pass over prompt + re-tokenized output)",
    "ar_self_agreement": "answer agreement between ar and a second ar run with other seeds (sampling only; "
                         "greedy: 1.0 by construction): the noise floor for answer agreement",
    "final_answer": "semspec.answers.final_answer: the last \\boxed{}, '#### N', 'the answer is N', the last "
                    "number of the last concluding sentence ('Therefore, ...', 'So, ...'), else the last number "
                    "in the output; numbers normalised (no $ or commas, 18.0 -> 18, 624 dollars -> 624)",
    "phase_share": "time per engine phase / wall-clock (prefill, draft, verify, judge, target_write, other)",
}

def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def agreement(a: list[dict | None], b: list[dict | None]) -> float | None:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if not pairs:
        return None
    return sum(1 for x, y in pairs if x["answer"] == y["answer"]) / len(pairs)


def _identical(a: list[dict | None], b: list[dict | None]) -> float | None:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return sum(1 for x, y in pairs if x["text"] == y["text"]) / len(pairs) if pairs else None


def verification_passes(rec: dict) -> int:
    m = rec["method"]
    if m == "token_sd":
        return max(0, rec["target_forward_passes"] - 1)  # minus the prefill
    if m == "hf_assisted":
        return rec["target_forward_passes"]  # every assisted-generation target pass verifies
    if m in ("semspec", "step_judge"):
        return rec["steps_drafted"]
    return 0


def step_acceptance_by_position(records: list[dict | None], max_position: int = 30) -> list[dict]:
    """Per step position (the step's index in the trace; positions past ``max_position``
    pooled into the last bucket): drafted steps, accepted steps, rate."""
    drafted: dict[int, int] = {}
    accepted: dict[int, int] = {}
    for rec in records:
        if rec is None:
            continue
        for s in rec.get("steps", []):
            decision = s[2]
            if decision not in ("accepted", "rejected"):
                continue
            pos = min(int(s[0]), max_position)
            drafted[pos] = drafted.get(pos, 0) + 1
            if decision == "accepted":
                accepted[pos] = accepted.get(pos, 0) + 1
    return [
        {"position": p, "drafted": drafted[p], "accepted": accepted.get(p, 0),
         "rate": accepted.get(p, 0) / drafted[p]}
        for p in sorted(drafted)
    ]


def method_figures(records: list[dict | None], ar: list[dict | None], prompts: list[dict]) -> dict[str, Any]:
    """All figures of one method (``records`` aligned with ``prompts`` and with ``ar``)."""
    done = [r for r in records if r is not None]
    out: dict[str, Any] = {"prompts_run": len(done)}
    if not done:
        return out
    method = done[0]["method"]
    wall = sum(r["wall_seconds"] for r in done)
    gen = sum(r["generated_tokens"] for r in done)
    tp = sum(r["target_forward_passes"] for r in done)
    drafted = sum(r["drafted_tokens"] for r in done)
    acc = sum(r["accepted_tokens"] for r in done)
    sd = sum(r["steps_drafted"] for r in done)
    sa = sum(r["steps_accepted"] for r in done)
    verif = sum(verification_passes(r) for r in done)
    draft_s = sum(r["draft_seconds"] for r in done)

    speedups, per_token, len_ratios = [], [], []
    for r, a in zip(records, ar):
        if r is None or a is None:
            continue
        if r["wall_seconds"] > 0:
            speedups.append(a["wall_seconds"] / r["wall_seconds"])
            if r["generated_tokens"] and a["generated_tokens"]:
                per_token.append((a["wall_seconds"] / a["generated_tokens"])
                                 / (r["wall_seconds"] / r["generated_tokens"]))
        if a["generated_tokens"]:
            len_ratios.append(r["generated_tokens"] / a["generated_tokens"])
    ar_gen = sum(a["generated_tokens"] for r, a in zip(records, ar) if r is not None and a is not None)

    refs = [p.get("reference") for p in prompts]
    scored = [(r, ref) for r, ref in zip(records, refs) if r is not None and ref is not None]
    lls = [r["target_mean_loglik"] for r in done if r.get("target_mean_loglik") is not None]

    phases: dict[str, float] = {}
    for r in done:
        for k, v in r.get("phase_seconds", {}).items():
            phases[k] = phases.get(k, 0.0) + v
    if phases:
        phases["other"] = max(0.0, wall - sum(phases.values()))

    out.update({
        "speedup_vs_ar": _median(speedups),
        "speedup_vs_ar_mean": _mean(speedups),
        "speedup_vs_ar_per_token": _median(per_token),
        "tokens_per_second": _ratio(gen, wall),
        "target_passes_per_token": _ratio(tp, gen),
        "draft_time_share": _ratio(draft_s, wall),
        "token_acceptance_rate": _ratio(acc, drafted),
        "mean_accepted_length": _ratio(acc, verif),
        "mean_accepted_length_incl_bonus": (_ratio(acc, verif) + 1.0)
        if method in ("token_sd", "hf_assisted") and verif else None,
        "step_acceptance_rate": _ratio(sa, sd),
        "answer_agreement_vs_ar": agreement(records, ar),
        "identical_to_ar": _identical(records, ar),
        "accuracy": (sum(bool(is_correct(r["answer"], ref)) for r, ref in scored) / len(scored)) if scored else None,
        "answers_found": sum(1 for r in done if r["answer"] is not None) / len(done),
        "output_length_vs_ar": _ratio(gen, ar_gen),
        "output_length_vs_ar_median": _median(len_ratios),
        "target_mean_loglik": _mean(lls),
        "phase_share": {k: v / wall for k, v in sorted(phases.items())} if wall else {},
        "totals": {
            "wall_seconds": wall, "generated_tokens": gen, "target_forward_passes": tp,
            "draft_forward_passes": sum(r["draft_forward_passes"] for r in done),
            "drafted_tokens": drafted, "accepted_tokens": acc, "steps_drafted": sd, "steps_accepted": sa,
            "verification_passes": verif, "draft_seconds": draft_s,
            "phase_seconds": phases,
        },
    })
    if method in ("semspec", "step_judge"):
        out["step_acceptance_by_position"] = step_acceptance_by_position(records)
    return out


def cost_model(methods: dict[str, dict]) -> dict[str, float | None]:
    """Unit costs measured in the run (seconds): what a step of each kind costs, so that a
    shortfall can be attributed to draft cost, acceptance or verification overhead."""
    def tot(label):
        return methods.get(label, {}).get("totals", {})

    ar = tot("ar")
    out: dict[str, float | None] = {
        "target_seconds_per_token_ar": _ratio(ar.get("wall_seconds", 0.0), ar.get("generated_tokens", 0)),
    }
    for label, m in methods.items():
        t = m.get("totals", {})
        ph = t.get("phase_seconds", {})
        if t.get("draft_forward_passes") and t.get("draft_seconds"):
            out[f"{label}.draft_seconds_per_draft_pass"] = t["draft_seconds"] / t["draft_forward_passes"]
        if t.get("steps_drafted") and ("verify" in ph or "judge" in ph):
            out[f"{label}.seconds_per_step_verification"] = (ph.get("verify", 0.0) + ph.get("judge", 0.0)) / \
                t["steps_drafted"]
        if t.get("drafted_tokens") and t.get("steps_drafted"):
            out[f"{label}.drafted_tokens_per_step"] = t["drafted_tokens"] / t["steps_drafted"]
            # seconds per drafted token spent drafting and verifying it: with every step
            # accepted, this is (about) the time per generated token, so ar's time per token
            # over it bounds the speed-up from above whatever the probes decide
            per_tok = (t.get("draft_seconds", 0.0) + ph.get("verify", 0.0) + ph.get("judge", 0.0)) / t["drafted_tokens"]
            out[f"{label}.seconds_per_drafted_token_draft_plus_verify"] = per_tok
            if out.get("target_seconds_per_token_ar") and per_tok:
                out[f"{label}.speedup_ceiling_at_full_acceptance"] = out["target_seconds_per_token_ar"] / per_tok
            if t.get("generated_tokens"):
                out[f"{label}.share_of_output_tokens_drafted"] = t.get("accepted_tokens", 0) / t["generated_tokens"]
            if t.get("drafted_tokens") and t.get("draft_seconds"):
                wasted = t["draft_seconds"] * (1 - t.get("accepted_tokens", 0) / t["drafted_tokens"])
                out[f"{label}.wasted_draft_time_share"] = wasted / t["wall_seconds"] if t.get("wall_seconds") else None
    tpt = out["target_seconds_per_token_ar"]
    if tpt:
        for k in [k for k in out if k.endswith("draft_seconds_per_draft_pass")]:
            out[k.replace("draft_seconds_per_draft_pass", "draft_cost_ratio")] = out[k] / tpt
    return out


def summarize(prompts: list[dict], runs: dict[str, list[dict | None]],
              plan: dict[str, dict], temperature: float) -> dict[str, Any]:
    """Figures for every method label in ``runs`` (aligned with ``prompts``), the ar noise
    floor, unit costs and the goal check."""
    ar = runs.get("ar", [None] * len(prompts))
    methods: dict[str, dict] = {}
    for label, recs in runs.items():
        fig = {**plan.get(label, {}), **method_figures(recs, ar, prompts)}
        methods[label] = fig
    if "ar_2" in runs:
        self_agree = agreement(ar, runs["ar_2"])
    else:
        self_agree = 1.0 if temperature <= 0 else None
    out = {"ar_self_agreement": self_agree, "methods": methods, "cost_model": cost_model(methods)}
    out["goal"] = goal_check(methods, self_agree)
    return out


def goal_check(methods: dict[str, dict], self_agree: float | None, speedup_goal: float = 2.0,
               max_agreement_drop: float = 0.05) -> dict[str, Any]:
    """Issue 6's goal for ``semspec`` at its default setting."""
    s = methods.get("semspec")
    if not s or s.get("speedup_vs_ar") is None:
        return {"evaluated": False, "reason": "semspec (default setting) did not run"}
    floor = None if self_agree is None else self_agree - max_agreement_drop
    agree = s.get("answer_agreement_vs_ar")
    peers = {}
    for peer in ("token_sd", "hf_assisted", "step_judge"):
        p = methods.get(peer)
        if not p or p.get("speedup_vs_ar") is None:
            continue
        peers[peer] = {
            "speedup_vs_ar": p["speedup_vs_ar"], "answer_agreement_vs_ar": p.get("answer_agreement_vs_ar"),
            "semspec_ahead": s["speedup_vs_ar"] > p["speedup_vs_ar"]
            and (agree or 0.0) >= (p.get("answer_agreement_vs_ar") or 0.0),
        }
    return {
        "evaluated": True,
        "speedup_goal": speedup_goal,
        "speedup_vs_ar": s["speedup_vs_ar"],
        "speedup_met": s["speedup_vs_ar"] >= speedup_goal,
        "agreement_floor": floor,
        "answer_agreement_vs_ar": agree,
        "agreement_met": None if floor is None or agree is None else agree >= floor - 1e-9,
        "peers": peers,
        "ahead_of_peers": all(p["semspec_ahead"] for p in peers.values()) if peers else None,
    }

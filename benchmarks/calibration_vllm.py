"""Probe calibration on vLLM against transformers' forward: its cost, and whether the shipped
probes read the same thing from its states.

1. `collect` with the shipped probes' settings (layer 22 / last, steps cut at "\\n", 32-token
   cap, 8 samples per prefix and model, 4 prefixes per question) on vLLM, then on
   transformers, timed, each into its own directory (different random streams: only their
   speed compares);
2. the vLLM run's sampled steps read again by transformers: the pooled states' largest
   difference (relative to the state's largest entry) and smallest cosine, the shipped probes' outputs on both and the acceptance probability
   min(1, p_T / p_D) on the draft's steps.

    python benchmarks/calibration_vllm.py --skip-lines 1000 --limit 4 --out /tmp/calvllm [--threads 2]

Prints one JSON object (and writes it to OUT/result.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from semspec.assets import GSM8K_TEST  # noqa: E402
from semspec.calibration.backends import load_models  # noqa: E402
from semspec.calibration.collect import (CollectConfig, SampledStep, collect, prefix_ids, read_prompts,  # noqa: E402
                                         step_ids)
from semspec.calibration.store import CalibrationStore  # noqa: E402
from semspec.probes import ProbePair, resolve_probes  # noqa: E402

TARGET, DRAFT, PROBES = "embedded:smollm2-135m", "embedded:smollm2-135m-draft", "embedded:smollm2-135m"


def shipped_settings(samples: int) -> CollectConfig:
    pair = ProbePair.load(resolve_probes(PROBES), strict_identity=False)
    rule = pair.step_rule()
    # the README's recipe for them: 4 prefixes of a 256-token sampled trace per question
    return CollectConfig(samples=samples, layer=pair.target.layer, draft_layer=pair.draft.layer,
                         step_delimiter=rule["step_delimiter"], max_step_tokens=rule["max_step_tokens"],
                         max_trace_steps=4, max_trace_tokens=256)


def timed_collect(models, prompts, out: Path, cfg: CollectConfig) -> dict:
    t0 = time.perf_counter()
    stats = collect(models, prompts, out, cfg)
    seconds = time.perf_counter() - t0
    return {"engine": models.engine, "prefixes": stats["prefixes_new"], "samples": stats["samples_new"],
            "seconds": round(seconds, 1), "samples_per_s": round(stats["samples_new"] / seconds, 2)}


def _fig(x) -> float:
    """Three significant digits (differences here span 1e-7 to 1)."""
    return float(f"{float(x):.3g}")


def compare(store: CalibrationStore, reference, cfg: CollectConfig, pair: ProbePair) -> dict:
    """The vLLM run's steps read by `reference` (transformers): state and probe differences."""
    diff = {"target": 0.0, "draft": 0.0}  # largest difference relative to the state's largest entry
    cosine = {"target": 1.0, "draft": 1.0}
    probe_out = {"target": ([], []), "draft": ([], [])}
    accept = ([], [])
    for key in store.keys():
        rec = store.read_prefix(key)
        # the steps as collect read them: each sampler's own ids, the other's text re-tokenized
        sampled = []
        for role in ("target", "draft"):
            memo = json.loads((store.root / "samples" / f"{role}__{key}.json").read_text())
            sampled += [SampledStep(x["tokens"], x["text"], x["end"]) for x in memo["steps"]]
        assert [s.text for s in sampled] == rec.texts
        for role in ("target", "draft"):
            tok = reference.tokenizer(role)
            steps = [step_ids(tok, reference.eos(role), s, own=(src == role)) for s, src in zip(sampled, rec.sources)]
            (theirs,) = reference.features(role, [(prefix_ids(tok, rec.prompt, rec.prefix_text), steps)], cfg)
            ours = rec.features[role]
            diff[role] = max(diff[role], float(((theirs - ours).abs().max(-1).values
                                                / theirs.abs().max(-1).values).max()))
            cosine[role] = min(cosine[role], float(torch.nn.functional.cosine_similarity(theirs, ours).min()))
            probe = pair.target if role == "target" else pair.draft
            with torch.no_grad():
                probe_out[role][0].append(probe(ours.float()))
                probe_out[role][1].append(probe(theirs.float()))
        drafted = torch.tensor([s == "draft" for s in rec.sources])
        for i in range(2):
            p_t, p_d = probe_out["target"][i][-1], probe_out["draft"][i][-1]
            accept[i].append(torch.clamp(p_t / p_d.clamp_min(1e-6), max=1.0)[drafted])
    out = {"steps": sum(len(store.read_prefix(k).texts) for k in store.keys()),
           "max_relative_state_diff": {r: _fig(v) for r, v in diff.items()},
           "min_state_cosine": {r: round(v, 7) for r, v in cosine.items()}}
    for role, (ours, theirs) in probe_out.items():
        d = (torch.cat(ours) - torch.cat(theirs)).abs()
        out[f"{role}_probe_abs_diff"] = {"mean": _fig(d.mean()), "max": _fig(d.max())}
    a = (torch.cat(accept[0]) - torch.cat(accept[1])).abs()
    out["acceptance_abs_diff"] = {"mean": _fig(a.mean()), "max": _fig(a.max()),
                                  "mean_vllm": round(float(torch.cat(accept[0]).mean()), 4),
                                  "mean_transformers": round(float(torch.cat(accept[1]).mean()), 4)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=str(GSM8K_TEST))
    ap.add_argument("--skip-lines", type=int, default=1000)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--dtype", default="auto", help="vLLM's (transformers' is float32 on a CPU)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    cfg = shipped_settings(args.samples)
    prompts = read_prompts(args.prompts, skip=args.skip_lines, limit=args.limit)
    on_vllm = load_models(TARGET, DRAFT, cfg, device="cpu", dtype=args.dtype)
    from semspec.calibration.transformers_models import TransformersModels
    from semspec.head import load_draft
    from semspec.models.loaded import load_model

    target = load_model(TARGET, device="cpu")
    reference = TransformersModels(target, load_draft(DRAFT, target, device="cpu"))
    result = {"settings": {"questions": len(prompts), "skip_lines": args.skip_lines, "samples": args.samples,
                           "layer": {"target": cfg.layer, "draft": cfg.draft_layer},
                           "threads": torch.get_num_threads()},
              "vllm": timed_collect(on_vllm, prompts, out / "vllm", cfg),
              "transformers": timed_collect(reference, prompts, out / "transformers", cfg)}
    result["speedup"] = round(result["vllm"]["samples_per_s"] / result["transformers"]["samples_per_s"], 2)
    pair = ProbePair.load(resolve_probes(PROBES), strict_identity=False)
    pair.target.eval(), pair.draft.eval()
    result["vllm_states_read_by_transformers"] = compare(CalibrationStore(out / "vllm"), reference, cfg, pair)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

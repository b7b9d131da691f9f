"""Would the target probe predict better with what the verification pass gives for free?

The target's pass over a drafted step yields, besides the pooled states the probe reads, the
target's own log-likelihood of the step's tokens and the entropy of its next-token
distributions there. This computes both for every sample of a labelled calibration
directory (`semjobs probe collect` + `probe label`), then fits the target probe on the same
question split as `semjobs probe train` three ways: the pooled states (what ships), the
pooled states plus the two figures, and the two figures alone. It reports the held-out
metrics of each (`semspec.calibration.train.regression_metrics`).

    python benchmarks/verify_features.py cal/paper --threads 1 [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from semspec.calibration.collect import prefix_ids, step_ids  # noqa: E402
from semspec.calibration.store import CalibrationStore  # noqa: E402
from semspec.calibration.train import _fit, _predict, load_role_data, regression_metrics, split_questions  # noqa: E402
from semspec.models.loaded import load_model  # noqa: E402

PROBE = ((64,), 0.3, 30, 0.5)  # (hidden_dims, dropout, epochs, weight_decay): the grid's usual pick
LOGISTIC = ((), 0.0, 30, 0.1)


@torch.inference_mode()
def step_stats(lm, prefix_ids: list[int], steps: list[list[int]]) -> torch.Tensor:
    """[len(steps), 2]: the target's mean log-probability of each step's tokens after the
    prefix, and the mean entropy of its next-token distributions at those positions."""
    model, dev = lm.model, lm.device
    out = model(input_ids=torch.tensor([prefix_ids], device=dev))
    first = out.logits[0, -1].float()
    rows = []
    for ids in steps:
        res = model(input_ids=torch.tensor([prefix_ids + ids], device=dev))
        # logits predicting each step token: the last prefix position, then the step's own
        logits = torch.cat([first[None], res.logits[0, len(prefix_ids):-1].float()], 0)
        logp = torch.log_softmax(logits, -1)
        tok = torch.tensor(ids, device=dev)
        ll = logp.gather(1, tok[:, None]).mean()
        ent = -(logp.exp() * logp).sum(-1).mean()
        rows.append(torch.stack([ll, ent]).cpu())
    return torch.stack(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration_dir")
    ap.add_argument("--holdout", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    store = CalibrationStore(args.calibration_dir)
    meta = store.meta()
    lm = load_model(meta["models"]["target"]["spec"] or meta["target"], device="cpu")
    t0 = time.perf_counter()
    extra = []
    for key in store.keys():  # the row order of load_role_data
        rec = store.read_prefix(key, with_features=False)
        steps = [step_ids(lm.tokenizer, lm.eos_token_ids, text, own=False) for text in rec.texts]
        extra.append(step_stats(lm, prefix_ids(lm.tokenizer, rec.prompt, rec.prefix_text), steps))
    extra_t = torch.cat(extra)
    stats_s = time.perf_counter() - t0
    data = load_role_data(args.calibration_dir)["target"]
    assert len(extra_t) == len(data.labels)
    train_q, test_q = split_questions(data.questions, args.holdout, args.seed)
    tr = torch.tensor([q in train_q for q in data.questions])
    te = ~tr
    y = data.labels
    variants = {
        "pooled states (shipped)": (data.features, PROBE),
        "pooled states + log-lik + entropy": (torch.cat([data.features, extra_t], 1), PROBE),
        "log-lik + entropy alone (logistic)": (extra_t, LOGISTIC),
    }
    results = {}
    for name, (x, cfg) in variants.items():
        probe, _ = _fit(x.shape[1], cfg, x[tr], y[tr], args.seed, 1e-3)
        results[name] = regression_metrics(_predict(probe, x[te]), y[te].numpy(), float(y[tr].mean()))
    out = {"calibration_dir": args.calibration_dir, "held_out_questions": sorted(test_q),
           "rows": {"train": int(tr.sum()), "held_out": int(te.sum())}, "stats_seconds": round(stats_s, 1),
           "results": results}
    print("| target probe inputs | held-out MSE | R² | Spearman | AUROC (label ≥ 0.5) |")
    print("|---|---|---|---|---|")
    for name, m in results.items():
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"| {name} | {m['mse']:.4f} | {fmt(m['r2'])} | {fmt(m['spearman'])} | {fmt(m['auroc_label_ge_0.5'])} |")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

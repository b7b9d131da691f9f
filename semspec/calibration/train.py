"""Probe training on a labelled calibration directory: one MLP per model.

Rows are samples (every sampled next step, from either model) with that model's pooled
hidden states as features and that model's meaning-frequency label as target (see
`labels.py`). The held-out split is **by question**: all prefixes of a held-out question
are held out, so a probe is never evaluated on a question it has seen a prefix of.

A small model selection (architecture x regularisation x epochs) runs as a grouped k-fold
by question over the training questions; the chosen configuration is retrained on all
training questions, its output is rescaled (sigmoid(a*z+b), fitted on the out-of-fold
predictions and folded into the last layer, since small data makes the MLP overconfident),
and it is evaluated once on the held-out questions. Reported per probe: MSE, R², Spearman, AUROC for
"label >= 0.5", the constant predictor's MSE, sizes; plus a calibration plot (PNG) and, for
the pair, how the acceptance rule does on the draft's held-out steps (`rule_eval.py`), and
how much the two models' step meanings overlap at all (`overlap.py`).
The probes are saved in the engine's format (`semspec.probes`) with that summary inside.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from semspec.calibration import DEFAULT_FLOOR_QUANTILE
from semspec.calibration.overlap import meaning_overlap
from semspec.calibration.rule_eval import choose_floor, evaluate_rule
from semspec.calibration.store import CalibrationStore, atomic_write_json

ROLES = ("target", "draft")
# (hidden_dims, dropout, epochs, weight_decay) tried by model selection.
DEFAULT_GRID: tuple[tuple[tuple[int, ...], float, int, float], ...] = (
    ((), 0.0, 30, 0.1),
    ((16,), 0.1, 30, 0.1),
    ((64,), 0.3, 30, 0.5),
    ((64,), 0.1, 60, 1e-2),
    ((256,), 0.5, 30, 0.5),
    ((256, 64), 0.3, 30, 0.5),  # the paper's shape: two hidden layers, dropout 0.3
)


@dataclass
class RoleData:
    features: torch.Tensor  # [M, H]
    labels: torch.Tensor  # [M]
    questions: list[str]  # question id per row
    prefixes: list[str]  # prefix key per row
    sources: list[str] | None = None  # who sampled the row's step ("target"/"draft")


def load_role_data(root: str | Path) -> dict[str, RoleData]:
    """Features and labels per model role from a collected and labelled directory."""
    store = CalibrationStore(root)
    labels = store.read_labels()["prefixes"]
    feats: dict[str, list[torch.Tensor]] = {r: [] for r in ROLES}
    ys: dict[str, list[float]] = {r: [] for r in ROLES}
    qs: dict[str, list[str]] = {r: [] for r in ROLES}
    ps: dict[str, list[str]] = {r: [] for r in ROLES}
    ss: dict[str, list[str]] = {r: [] for r in ROLES}
    for key in store.keys():
        if key not in labels:
            raise ValueError(f"prefix {key} has no labels; re-run `semjobs probe label`")
        rec = store.read_prefix(key)
        for role in ROLES:
            if role not in rec.features:
                continue
            f = rec.features[role]
            lab = labels[key].get(role)
            if lab is None or len(lab) != f.shape[0]:
                raise ValueError(f"prefix {key}: {role} labels do not match its {f.shape[0]} samples")
            feats[role].append(f)
            ys[role].extend(float(v) for v in lab)
            qs[role].extend([rec.question_id] * f.shape[0])
            ps[role].extend([key] * f.shape[0])
            ss[role].extend(rec.sources)
    out = {}
    for role in ROLES:
        if feats[role]:
            out[role] = RoleData(torch.cat(feats[role]), torch.tensor(ys[role]), qs[role], ps[role], ss[role])
    if not out:
        raise ValueError(f"{root} holds no features")
    return out


def split_questions(questions: Sequence[str], holdout: float, seed: int) -> tuple[set[str], set[str]]:
    """(train, held-out) question ids: a seeded shuffle, at least one question on each side."""
    uniq = sorted(set(questions))
    if len(uniq) < 2:
        raise ValueError("a split by question needs at least 2 questions")
    rng = random.Random(seed)
    rng.shuffle(uniq)
    n_test = min(len(uniq) - 1, max(1, round(holdout * len(uniq))))
    return set(uniq[n_test:]), set(uniq[:n_test])


# --------------------------------------------------------------------------- metrics


def auroc(scores: Sequence[float], positives: Sequence[bool]) -> float | None:
    """Area under the ROC curve (ties count half); None when only one class is present."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(positives, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    from scipy.stats import rankdata

    ranks = rankdata(s)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def regression_metrics(pred: Sequence[float], labels: Sequence[float], train_mean: float) -> dict:
    from scipy.stats import spearmanr

    p = np.asarray(pred, dtype=float)
    y = np.asarray(labels, dtype=float)
    mse = float(np.mean((p - y) ** 2))
    sst = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((p - y) ** 2)) / sst if sst > 0 else None
    rho = None
    if np.ptp(p) > 0 and np.ptp(y) > 0:
        rho = float(spearmanr(p, y).statistic)
        rho = None if math.isnan(rho) else rho
    return {
        "mse": mse,
        "r2": r2,
        "spearman": rho,
        "auroc_label_ge_0.5": auroc(p, y >= 0.5),
        "constant_mse": float(np.mean((train_mean - y) ** 2)),
        "positive_rate": float(np.mean(y >= 0.5)),
        "n": int(len(y)),
    }


# --------------------------------------------------------------------------- training


def _fit(hidden_size: int, cfg, x: torch.Tensor, y: torch.Tensor, seed: int, lr: float, **probe_kw):
    from semspec.probes import Probe, train_probe

    dims, dropout, epochs, wd = cfg
    torch.manual_seed(seed)
    probe = Probe(hidden_size, hidden_dims=dims, dropout=dropout, **probe_kw)
    # Tiny MLPs train fastest on one thread (and do not fight other work for the cores).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        info = train_probe(probe, x, y, epochs=epochs, lr=lr, weight_decay=wd, seed=seed)
    finally:
        torch.set_num_threads(threads)
    return probe, info


@torch.no_grad()
def _predict(probe, x: torch.Tensor) -> np.ndarray:
    probe.eval()
    return probe(x.float()).cpu().numpy()


def _group_folds(questions: Sequence[str], k: int, seed: int) -> list[set[str]]:
    uniq = sorted(set(questions))
    random.Random(seed).shuffle(uniq)
    k = max(2, min(k, len(uniq)))
    return [set(uniq[i::k]) for i in range(k)]


@torch.no_grad()
def _logits(probe, x: torch.Tensor) -> np.ndarray:
    probe.eval()
    return probe.logits(x.float()).cpu().numpy()


def fit_recalibration(logits: np.ndarray, labels: np.ndarray, steps: int = 300) -> tuple[float, float]:
    """(a, b) minimising the MSE of sigmoid(a * logit + b) against the labels (Platt-style
    scaling fitted on out-of-fold logits): small data makes the MLP overconfident."""
    z = torch.tensor(logits, dtype=torch.float64)
    y = torch.tensor(labels, dtype=torch.float64)
    ab = torch.tensor([1.0, 0.0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([ab], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.mean((torch.sigmoid(ab[0] * z + ab[1]) - y) ** 2)
        loss.backward()
        return loss

    opt.step(closure)
    a, b = (float(v) for v in ab.detach())
    if not (math.isfinite(a) and math.isfinite(b)) or a <= 0:
        return 1.0, 0.0
    return a, b


@torch.no_grad()
def apply_recalibration(probe, a: float, b: float) -> None:
    """Fold sigmoid(a * z + b) into the probe's last linear layer (same file format)."""
    last = probe.mlp[-1]
    last.weight.mul_(a)
    last.bias.mul_(a).add_(b)


def select_config(data: RoleData, grid, seed: int, lr: float, folds: int = 5):
    """Grouped k-fold by question over the training rows: pick the grid entry with the
    lowest out-of-fold MSE; return it, the table, and its out-of-fold logits."""
    fold_sets = _group_folds(data.questions, folds, seed + 1)
    if len(set(data.questions)) < 3:
        return grid[0], [], None
    tried, oof = [], []
    y = data.labels.numpy()
    for cfg in grid:
        z = np.zeros(len(y))
        for held in fold_sets:
            te = torch.tensor([q in held for q in data.questions])
            probe, _ = _fit(data.features.shape[1], cfg, data.features[~te], data.labels[~te], seed, lr)
            z[te.numpy()] = _logits(probe, data.features[te])
        mse = float(np.mean((1 / (1 + np.exp(-z)) - y) ** 2))
        tried.append({"hidden_dims": list(cfg[0]), "dropout": cfg[1], "epochs": cfg[2],
                      "weight_decay": cfg[3], "cv_mse": mse})
        oof.append(z)
    best = min(range(len(grid)), key=lambda i: tried[i]["cv_mse"])
    return grid[best], tried, oof[best]


def calibration_plot(results: dict[str, dict], path: Path, bins: int = 10) -> Path:
    """Predicted probability vs mean label per bin, one panel per probe (held-out rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roles = [r for r in ROLES if r in results]
    fig, axes = plt.subplots(1, len(roles), figsize=(5 * len(roles), 4.5), squeeze=False)
    for ax, role in zip(axes[0], roles):
        p = np.asarray(results[role]["pred"])
        y = np.asarray(results[role]["labels"])
        edges = np.linspace(0, 1, bins + 1)
        idx = np.clip(np.digitize(p, edges) - 1, 0, bins - 1)
        xs, ys, ns = [], [], []
        for b in range(bins):
            m = idx == b
            if m.any():
                xs.append(p[m].mean())
                ys.append(y[m].mean())
                ns.append(int(m.sum()))
        ax.scatter(p, y, s=6, alpha=0.15, color="grey", label="held-out samples")
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        ax.plot(xs, ys, "o-", color="C0" if role == "target" else "C1", label="mean label per bin")
        for x_, y_, n_ in zip(xs, ys, ns):
            ax.annotate(str(n_), (x_, y_), textcoords="offset points", xytext=(3, 3), fontsize=7)
        m = results[role]["metrics"]
        r2 = "n/a" if m["r2"] is None else f"{m['r2']:.2f}"
        rho = "n/a" if m["spearman"] is None else f"{m['spearman']:.2f}"
        ax.set_title(f"{role} probe: R²={r2}, Spearman={rho}, n={m['n']}")
        ax.set_xlabel("predicted semantic probability")
        ax.set_ylabel("label (cluster frequency)")
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rows_aligned(data: dict[str, RoleData], roles: Sequence[str]) -> bool:
    """Both probes were fitted on the same sampled steps in the same order (every prefix
    stores both models' features), so their held-out rows can be paired step by step."""
    if set(roles) != set(ROLES):
        return False
    t, d = data["target"], data["draft"]
    return t.prefixes == d.prefixes and t.sources == d.sources and t.sources is not None


def train_probes(
    root: str | Path,
    out: str | Path,
    holdout: float = 0.2,
    seed: int = 0,
    lr: float = 1e-3,
    grid=DEFAULT_GRID,
    roles: Sequence[str] = ROLES,
    folds: int = 5,
    recalibrate: bool = True,
    floor_quantile: float = DEFAULT_FLOOR_QUANTILE,
) -> dict:
    """Train, evaluate and save one probe per model role, the target probe with the floor on
    p_T that greedy decoding applies unless a job sets one (``floor_quantile``; 0: none). Returns the
    report (also written to OUT/report.json, with the calibration plot OUT/calibration.png)."""
    from semspec.probes import ProbePair

    t0 = time.time()
    root, out = Path(root), Path(out)
    store = CalibrationStore(root)
    meta = store.meta()
    labelled = store.read_labels()
    judge = labelled.get("judge", {})
    data = load_role_data(root)
    roles = [r for r in roles if r in data]
    all_questions = sorted({q for r in roles for q in data[r].questions})
    train_q, test_q = split_questions(all_questions, holdout, seed)
    report: dict = {
        "data": str(root),
        "questions": {"train": len(train_q), "held_out": len(test_q)},
        "held_out_questions": sorted(test_q),
        "judge": judge,
        "seed": seed,
        "probes": {},
    }
    results: dict[str, dict] = {}
    probes = {}
    for role in roles:
        d = data[role]
        tr = torch.tensor([q in train_q for q in d.questions])
        te = ~tr
        train_rows = RoleData(d.features[tr], d.labels[tr], [q for q, m in zip(d.questions, tr) if m], [])
        cfg, tried, oof_logits = select_config(train_rows, grid, seed, lr, folds)
        model_meta = meta["models"][role]
        probe, info = _fit(
            d.features.shape[1], cfg, d.features[tr], d.labels[tr], seed, lr,
            layer=int(meta["layer"][role]),
            pooling=meta.get("pooling", "mean"),
            model_identity=model_meta["identity"],
            role=role,
        )
        recal = None
        if recalibrate and oof_logits is not None:
            y_tr = train_rows.labels.numpy()
            a, b = fit_recalibration(oof_logits, y_tr)
            before = float(np.mean((1 / (1 + np.exp(-oof_logits)) - y_tr) ** 2))
            after = float(np.mean((1 / (1 + np.exp(-(a * oof_logits + b))) - y_tr) ** 2))
            if after < before:
                apply_recalibration(probe, a, b)
                recal = {"a": a, "b": b, "cv_mse_before": before, "cv_mse_after": after}
        pred = _predict(probe, d.features[te])
        metrics = regression_metrics(pred, d.labels[te].numpy(), float(d.labels[tr].mean()))
        by_source = {}
        te_src = [src for src, m in zip(d.sources, te.tolist()) if m] if d.sources else []
        for src in sorted(set(te_src)):
            sel = np.array([x == src for x in te_src])
            by_source[src] = regression_metrics(pred[sel], d.labels[te].numpy()[sel], float(d.labels[tr].mean()))
        summary = {
            "held_out": metrics,
            "held_out_by_sampler": by_source,
            "train": {"mse": info["train_mse"], "n": info["n_train"]},
            "config": {"hidden_dims": list(cfg[0]), "dropout": cfg[1], "epochs": cfg[2],
                       "weight_decay": cfg[3], "lr": lr},
            "selection": tried,
            "recalibration": recal,
            "split": "by question",
            "questions": {"train": len(train_q), "held_out": len(test_q)},
            "judge": judge,
            "samples_per_prefix": meta.get("samples"),
            "collect": {k: meta.get(k) for k in ("temperature", "top_p", "step_delimiter", "max_step_tokens",
                                                 "trace_temperature", "prompts")},
        }
        probe.training_summary = summary
        probes[role] = probe
        results[role] = {"pred": pred.tolist(), "labels": d.labels[te].tolist(), "metrics": metrics,
                         "sources": te_src}
        report["probes"][role] = summary
    # who sampled each step, per prefix: from the rows already loaded, not the files again
    rows = data[roles[0]]
    sources: dict[str, list[str]] = {}
    for key, src in zip(rows.prefixes, rows.sources):
        sources.setdefault(key, []).append(src)
    report["meaning_overlap"] = meaning_overlap(
        (labelled["prefixes"][key]["clusters"], src) for key, src in sorted(sources.items())
    )
    floor = None
    if floor_quantile > 0 and "target" in probes and "target" in results["target"]["sources"]:
        floor = choose_floor(results["target"]["pred"], results["target"]["sources"], floor_quantile)
        probes["target"].training_summary["floor"] = floor  # what ProbePair.floor reads
    if _rows_aligned(data, roles):
        report["acceptance_rule_held_out"] = evaluate_rule(
            results["target"]["labels"], results["draft"]["labels"],
            results["target"]["pred"], results["draft"]["pred"], results["target"]["sources"],
            floor=None if floor is None else floor["tau"],
        )
    out.mkdir(parents=True, exist_ok=True)
    if "target" in probes and "draft" in probes:
        ProbePair(target=probes["target"], draft=probes["draft"]).save(out)
    else:
        for role, probe in probes.items():
            probe.save(out / f"{role}.safetensors")
    plot = calibration_plot(results, out / "calibration.png")
    report["calibration_plot"] = str(plot)
    report["seconds"] = round(time.time() - t0, 1)
    atomic_write_json(out / "report.json", report)
    return report

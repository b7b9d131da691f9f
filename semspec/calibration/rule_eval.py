"""How the acceptance rule behaves on held-out steps that the draft sampled.

The engine keeps a drafted step with probability min(1, p_T / p_D), and rejects it outright
when p_T is below the floor τ or the ratio below ``ratio_floor`` (the paper's rule;
``semspec.types.GenerationConfig``: ``ratio_floor`` 0.6; τ 0, or greedy the probes' own
(`choose_floor`);
`semspec.acceptance.meaning_decision`). For every
held-out step the draft sampled in calibration we know the label estimates of both
probabilities (L_T, L_D: the shares of each model's N samples in the step's meaning
cluster), so the rule can be scored twice, once with the probes' predictions and once with
the labels themselves (the "oracle": what perfect probes would do, up to the noise of N
samples):

- ``acceptance``: mean acceptance probability over the draft's steps — the speed lever;
- ``kept_target_frequency``: mean L_T of the kept steps, weighted by acceptance probability —
  how often the target itself says what the kept steps say. Compare it with
  ``draft_target_frequency`` (keeping every drafted step) and ``target_own_frequency`` (L_T
  of the target's own samples: what target-only decoding keeps);
- ``kept_unseen_share``: the share of the kept mass on steps whose meaning none of the
  target's N samples had (L_T = 0).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def acceptance_probability(p_target, p_draft, tau: float = 0.0, ratio_floor: float = 0.0) -> np.ndarray:
    """min(1, p_T / p_D) per step, zero where p_T < τ or the ratio < ``ratio_floor`` (the
    engine's rule)."""
    p_t = np.asarray(p_target, dtype=float)
    ratio = p_t / np.maximum(np.asarray(p_draft, dtype=float), 1e-6)
    return np.where((p_t < tau) | (ratio < ratio_floor), 0.0, np.minimum(1.0, ratio))


def choose_floor(pred_target, sources, quantile: float) -> dict:
    """The floor τ on p_T that greedy decoding applies by default (``GenerationConfig.tau``):
    the ``quantile`` of the target probe's predictions on the target's *own* held-out steps. A
    drafted step is then kept only if the probe rates it at least as target-like as it rates
    all but that share of what the target itself writes; a probe's p_T scale is its
    calibration's, so a floor fixed across calibrations would mean something else on each
    (docs/benchmarks.md "A floor on p_T for greedy jobs")."""
    own = np.asarray(pred_target, dtype=float)[np.asarray(sources) == "target"]
    if not 0.0 <= quantile < 1.0:
        raise ValueError(f"the floor's quantile must be in [0, 1), not {quantile}")
    if own.size == 0:
        raise ValueError("no steps sampled by the target among the rows: no floor to choose")
    tau = float(np.quantile(own, quantile)) if quantile > 0 else 0.0
    return {"tau": round(tau, 4), "quantile": float(quantile), "n_target_steps": int(own.size)}


def _kept_stats(accept: np.ndarray, label_t: np.ndarray) -> dict:
    mass = float(accept.sum())
    return {
        "acceptance": float(accept.mean()),
        "kept_target_frequency": float((accept * label_t).sum() / mass) if mass > 0 else None,
        "kept_unseen_share": float((accept * (label_t == 0)).sum() / mass) if mass > 0 else None,
    }


def evaluate_rule(
    label_target: Sequence[float],
    label_draft: Sequence[float],
    pred_target: Sequence[float],
    pred_draft: Sequence[float],
    sources: Sequence[str],
    taus: Sequence[float] = (0.0, 0.05, 0.1, 0.2),
    ratio_floors: Sequence[float] = (0.5, 0.6, 0.7),
    floor: float | None = None,
) -> dict:
    """Score the acceptance rule on aligned rows (one per sampled step; `sources` says who
    sampled it). Only the draft's steps are decided by the rule; the target's own steps give
    the reference frequency. ``floor`` (a chosen τ, `choose_floor`) is scored beside ``taus``."""
    src = np.asarray(sources)
    is_draft = src == "draft"
    l_t = np.asarray(label_target, dtype=float)
    if not is_draft.any():
        raise ValueError("no steps sampled by the draft among the rows")
    d_lt, d_ld = l_t[is_draft], np.asarray(label_draft, dtype=float)[is_draft]
    d_pt, d_pd = np.asarray(pred_target, dtype=float)[is_draft], np.asarray(pred_draft, dtype=float)[is_draft]
    own = l_t[src == "target"]
    return {
        "n_draft_steps": int(is_draft.sum()),
        "draft_target_frequency": float(d_lt.mean()),
        "target_own_frequency": float(own.mean()) if own.size else None,
        "by_tau": [
            {
                "tau": float(tau),
                "probes": _kept_stats(acceptance_probability(d_pt, d_pd, tau), d_lt),
                "oracle": _kept_stats(acceptance_probability(d_lt, d_ld, tau), d_lt),
            }
            for tau in (taus if floor is None else sorted({*taus, floor}))
        ],
        "by_ratio_floor": [  # the paper's rule, at the floors its variants use
            {
                "ratio_floor": float(r),
                "probes": _kept_stats(acceptance_probability(d_pt, d_pd, ratio_floor=r), d_lt),
                "oracle": _kept_stats(acceptance_probability(d_lt, d_ld, ratio_floor=r), d_lt),
            }
            for r in ratio_floors
        ],
    }

"""Probe calibration: semantic-equivalence judges, meaning-cluster labels, data collection
and probe training (see README.md in this directory)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_PROBES_ROOT = Path(__file__).resolve().parent / "default_probes"
EMBEDDED_PAIR = "smollm2-135m"  # embedded:smollm2-135m + embedded:smollm2-135m-draft
# The floor on p_T that training stores with the probes, for greedy jobs (rule_eval.choose_floor):
# this quantile of the target probe's p_T on the target's own held-out steps. On the embedded
# pair it brought the greedy gap to the target's own text within 0.25 nats/token at token_sd's
# speed (docs/benchmarks.md "A floor on p_T for greedy jobs").
DEFAULT_FLOOR_QUANTILE = 0.1


def default_probes_dir(pair: str = EMBEDDED_PAIR) -> Path | None:
    """The committed probe directory for an embedded model pair, or None if none ships."""
    d = DEFAULT_PROBES_ROOT / pair
    return d if (d / "target.safetensors").exists() and (d / "draft.safetensors").exists() else None

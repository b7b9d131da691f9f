"""benchmarks/probe_cross_eval.py: scoring a probe pair on another calibration's held-out
steps reproduces `probe train`'s own scoring for the probes trained there."""

import importlib.util
from pathlib import Path

import pytest

from semspec.calibration.train import train_probes
from semspec.probes import ProbePair

from .test_train import make_synthetic_dir

_spec = importlib.util.spec_from_file_location(
    "probe_cross_eval", Path(__file__).resolve().parents[3] / "benchmarks" / "probe_cross_eval.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_cross_eval_matches_train_and_scores_other_pairs(tmp_path):
    root = make_synthetic_dir(tmp_path / "cal")
    grid = (((), 0.0, 60, 1e-2),)
    report = train_probes(root, tmp_path / "probes", holdout=0.25, seed=0, grid=grid)
    split = tmp_path / "probes" / "report.json"
    own = bench.cross_eval(str(root), str(tmp_path / "probes"), str(split))
    expected = report["acceptance_rule_held_out"]
    assert own["n_draft_steps"] == expected["n_draft_steps"] == 3 * 3 * 8
    for got, want in zip(own["by_tau"] + own["by_ratio_floor"], expected["by_tau"] + expected["by_ratio_floor"]):
        assert got["probes"]["acceptance"] == pytest.approx(want["probes"]["acceptance"], abs=1e-5)
        assert got["oracle"] == pytest.approx(want["oracle"])
    ProbePair.always_reject(16, 12).save(tmp_path / "reject")
    other = bench.cross_eval(str(root), str(tmp_path / "reject"), str(split))
    assert all(r["probes"]["acceptance"] == 0.0 for r in other["by_tau"] + other["by_ratio_floor"])
    assert other["by_tau"][0]["oracle"] == expected["by_tau"][0]["oracle"]  # same steps, same labels

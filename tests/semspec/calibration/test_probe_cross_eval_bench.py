"""benchmarks/probe_cross_eval.py: scoring a probe pair on another calibration's held-out
steps reproduces `probe train`'s own scoring for the probes trained there."""

import importlib.util
import json
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
    rows = lambda result: {(k, row[k]): row for k in ("tau", "ratio_floor")  # noqa: E731
                           for row in result["by_" + k]}
    want = rows(expected)
    for key, got in rows(own).items():  # the fixed floors; train also scored its own
        assert got["probes"]["acceptance"] == pytest.approx(want[key]["probes"]["acceptance"], abs=1e-5)
        assert got["oracle"] == pytest.approx(want[key]["oracle"])
    ProbePair.always_reject(16, 12).save(tmp_path / "reject")
    other = bench.cross_eval(str(root), str(tmp_path / "reject"), str(split))
    assert all(r["probes"]["acceptance"] == 0.0 for r in other["by_tau"] + other["by_ratio_floor"])
    assert other["by_tau"][0]["oracle"] == expected["by_tau"][0]["oracle"]  # same steps, same labels


def test_a_floor_stored_afterwards_is_the_one_train_would_have_chosen(tmp_path):
    """Probes trained without a floor get the one `probe train` chooses, in the target probe's
    file and the report; the draft probe's file is left byte for byte."""
    root = make_synthetic_dir(tmp_path / "cal")
    grid = (((), 0.0, 60, 1e-2),)
    chosen = train_probes(root, tmp_path / "with", holdout=0.25, seed=0, grid=grid)["probes"]["target"]["floor"]
    train_probes(root, tmp_path / "without", holdout=0.25, seed=0, grid=grid, floor_quantile=0.0)
    draft_bytes = (tmp_path / "without" / "draft.safetensors").read_bytes()
    out = bench.cross_eval(str(root), str(tmp_path / "without"), str(tmp_path / "without" / "report.json"),
                           floor_quantile=chosen["quantile"])
    assert out["floor"]["tau"] == pytest.approx(chosen["tau"], abs=1e-4)
    assert ProbePair.load(tmp_path / "without").floor() == out["floor"]["tau"]
    assert (tmp_path / "without" / "draft.safetensors").read_bytes() == draft_bytes
    report = json.loads((tmp_path / "without" / "report.json").read_text())
    assert report["probes"]["target"]["floor"] == out["floor"]
    assert out["floor"]["tau"] in [row["tau"] for row in report["acceptance_rule_held_out_with_floor"]["by_tau"]]

import json

import numpy as np
import pytest
import torch

from semspec.calibration import DEFAULT_FLOOR_QUANTILE
from semspec.calibration.store import CalibrationStore, PrefixRecord
from semspec.calibration.train import (
    auroc,
    load_role_data,
    regression_metrics,
    split_questions,
    train_probes,
)
from semspec.probes import Probe, ProbePair, read_metadata


def make_synthetic_dir(root, questions=12, prefixes_per_q=3, samples=8, hidden=(16, 12), seed=0):
    """A collected + labelled directory whose labels are a smooth function of the features."""
    g = torch.Generator().manual_seed(seed)
    store = CalibrationStore(root)
    store.init({
        "target": "synthetic-target", "draft": "synthetic-draft", "samples": samples,
        "layer": {"target": -1, "draft": -1}, "pooling": "mean", "step_delimiter": "\n\n",
        "models": {
            "target": {"identity": "/m/t@sha256:" + "a" * 64, "hidden_size": hidden[0]},
            "draft": {"identity": "/m/d@sha256:" + "b" * 64, "hidden_size": hidden[1]},
        },
    })
    w = {r: torch.randn(h, generator=g) for r, h in zip(("target", "draft"), hidden)}
    labels = {}
    for q in range(questions):
        for k in range(prefixes_per_q):
            key = f"q{q}__{k:03d}"
            n = 2 * samples
            feats = {r: torch.randn(n, h, generator=g) for r, h in zip(("target", "draft"), hidden)}
            lab = {r: torch.sigmoid(feats[r] @ w[r] / 2).tolist() for r in feats}
            store.write_prefix(PrefixRecord(
                key=key, question_id=f"q{q}", k=k, prompt="p", prefix_text="",
                texts=[f"s{i}" for i in range(n)], sources=["target"] * samples + ["draft"] * samples,
                features=feats,
            ))
            labels[key] = {"clusters": list(range(n)), **lab}
    store.write_labels({"judge": "synthetic"}, labels)
    return root


def test_split_by_question_is_disjoint_and_seeded():
    qs = [f"q{i}" for i in range(10)] * 3
    tr, te = split_questions(qs, 0.2, seed=1)
    assert tr.isdisjoint(te) and tr | te == set(qs) and len(te) == 2
    assert split_questions(qs, 0.2, seed=1) == (tr, te)
    with pytest.raises(ValueError):
        split_questions(["q"], 0.2, 0)


def test_metrics():
    assert auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    assert auroc([0.1, 0.2], [True, True]) is None
    m = regression_metrics([0.1, 0.5, 0.9], [0.0, 0.5, 1.0], train_mean=0.5)
    assert m["r2"] > 0.9 and m["spearman"] == pytest.approx(1.0)
    assert m["constant_mse"] == pytest.approx(np.mean([0.25, 0.0, 0.25]))
    assert regression_metrics([0.3, 0.3], [0.2, 0.4], 0.3)["spearman"] is None


def test_train_probes_on_synthetic_data(tmp_path):
    root = make_synthetic_dir(tmp_path / "cal")
    data = load_role_data(root)
    assert data["target"].features.shape == (12 * 3 * 16, 16)
    grid = (((), 0.0, 60, 1e-2), ((32,), 0.0, 60, 1e-2))
    report = train_probes(root, tmp_path / "probes", holdout=0.25, seed=0, grid=grid)
    assert len(report["probes"]["target"]["selection"]) == 2
    for role in ("target", "draft"):
        held = report["probes"][role]["held_out"]
        assert held["r2"] > 0.5, held
        assert held["spearman"] > 0.7
        assert held["mse"] < held["constant_mse"]
    assert set(report["probes"]["target"]["held_out_by_sampler"]) == {"target", "draft"}
    assert report["meaning_overlap"]["prefixes"] == 12 * 3  # every prefix, no model involved
    rule = report["acceptance_rule_held_out"]
    assert rule["n_draft_steps"] == 3 * 3 * 8  # held-out questions x prefixes x draft samples
    for row in rule["by_tau"] + rule["by_ratio_floor"]:
        assert 0.0 <= row["probes"]["acceptance"] <= 1.0 and 0.0 <= row["oracle"]["acceptance"] <= 1.0
    # a floor on the ratio only takes steps away
    assert all(r["probes"]["acceptance"] <= rule["by_tau"][0]["probes"]["acceptance"] + 1e-12
               for r in rule["by_ratio_floor"])
    # Held-out questions are whole questions.
    assert report["questions"] == {"train": 9, "held_out": 3}
    pair = ProbePair.load(tmp_path / "probes")
    assert pair.target.hidden_size == 16 and pair.draft.hidden_size == 12
    meta = read_metadata(tmp_path / "probes" / "target.safetensors")
    assert meta["model_identity"].endswith("a" * 64)
    assert meta["training"]["split"] == "by question"
    assert meta["training"]["held_out"]["r2"] == report["probes"]["target"]["held_out"]["r2"]
    assert (tmp_path / "probes" / "calibration.png").stat().st_size > 10_000
    # the floor on p_T: the default quantile of the target probe's p_T on the target's own
    # held-out steps, stored in the target probe's file, where the engine's step rule reads it
    floor = meta["training"]["floor"]
    held = [i for i, q in enumerate(data["target"].questions) if q in set(report["held_out_questions"])]
    own = [i for i in held if data["target"].sources[i] == "target"]
    pair.target.eval()
    with torch.no_grad():
        p_own = pair.target(data["target"].features[own]).numpy()
    assert floor["n_target_steps"] == len(own) == 3 * 3 * 8
    assert floor["tau"] == pytest.approx(float(np.quantile(p_own, DEFAULT_FLOOR_QUANTILE)), abs=1e-4)
    assert pair.floor() == floor["tau"]
    assert floor["tau"] in [row["tau"] for row in rule["by_tau"]]  # scored beside the fixed floors
    assert json.loads((tmp_path / "probes" / "report.json").read_text())["probes"]["draft"]


def test_probes_trained_without_a_floor_set_none(tmp_path):
    root = make_synthetic_dir(tmp_path / "cal", questions=4, prefixes_per_q=1)
    train_probes(root, tmp_path / "probes", holdout=0.25, grid=(((), 0.0, 5, 1e-2),), floor_quantile=0.0)
    pair = ProbePair.load(tmp_path / "probes")
    assert "floor" not in pair.target.training_summary and pair.floor() is None


def test_train_needs_labels(tmp_path):
    root = make_synthetic_dir(tmp_path / "cal", questions=3, prefixes_per_q=1)
    (root / "labels.json").unlink()
    with pytest.raises(FileNotFoundError, match="probe label"):
        train_probes(root, tmp_path / "out")


def test_recalibration_folds_into_last_layer():
    from semspec.calibration.train import apply_recalibration, fit_recalibration

    rng = np.random.default_rng(0)
    z = rng.normal(size=400) * 4  # overconfident logits
    y = 1 / (1 + np.exp(-(0.5 * z - 1.0)))  # true relation: a=0.5, b=-1
    a, b = fit_recalibration(z, y)
    assert a == pytest.approx(0.5, abs=0.05) and b == pytest.approx(-1.0, abs=0.05)
    probe = Probe(8, hidden_dims=(4,))
    x = torch.randn(5, 8)
    before = probe.logits(x).detach()
    apply_recalibration(probe, a, b)
    assert torch.allclose(probe.logits(x).detach(), a * before + b, atol=1e-5)

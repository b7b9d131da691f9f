"""The default probes shipped for the embedded pair: the target with the layer draft."""

import json

import pytest

from semspec.calibration import default_probes_dir
from semspec.probes import ProbePair, read_metadata

PAIRS = {"smollm2-135m": "embedded:smollm2-135m-draft"}


def _shipped(pair: str):
    d = default_probes_dir(pair)
    if d is None:
        pytest.skip(f"no default probes shipped for {pair}")
    return d


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_default_probe_files_are_well_formed(pair):
    d = _shipped(pair)
    for role in ("target", "draft"):
        meta = read_metadata(d / f"{role}.safetensors")
        assert meta["role"] == role and meta["kind"] == "mlp"
        assert meta["training"]["split"] == "by question"
        assert meta["training"]["held_out"]["n"] > 0
        assert (d / f"{role}.safetensors").stat().st_size < 2_000_000
    # the floor greedy jobs take, as its calibration chose it (semspec/calibration/README.md)
    floor = read_metadata(d / "target.safetensors")["training"]["floor"]
    assert 0 < ProbePair.load(d).floor() == floor["tau"] < 1 and floor["n_target_steps"] > 0
    assert json.loads((d / "report.json").read_text())["probes"]["target"]["floor"] == floor


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_default_probes_fit_the_embedded_models(pair):
    from semspec.head import load_draft
    from semspec.models.loaded import load_model

    d = _shipped(pair)
    target = load_model("embedded:smollm2-135m", device="cpu")
    draft = load_draft(PAIRS[pair], target, device="cpu")
    probes = ProbePair.load(d, target, draft)  # checks hidden size, layer, content hash
    assert probes.target.hidden_size == target.hidden_size


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_the_shipped_probes_name_the_embedded_models_by_their_sources(pair, monkeypatch):
    """Identities come from the GGUF and the committed artifacts, so they hold whatever
    transformers release writes the converted and materialised directories."""
    from semspec.models import embedded_draft as embedded
    from semspec.models import gguf
    from semspec.preflight import method_problem

    d = _shipped(pair)
    for tag in ("tf-now", "tf-another-release"):
        for module in (gguf, embedded):  # the two that name directories by the release
            monkeypatch.setattr(module, "library_tag", lambda tag=tag: tag)
        assert method_problem("semspec", None, PAIRS[pair], f"embedded:{pair}") is None
    meta = read_metadata(d / "draft.safetensors")
    assert meta["model_identity"].startswith(PAIRS[pair] + "@sha256:")


@pytest.mark.real_model
@pytest.mark.slow
def test_the_shipped_probes_load_after_the_cache_is_rebuilt_under_another_home(tmp_path):
    """A fresh HOME and cache directory convert and materialise the models anew (under the
    installed transformers): the default step engine still takes the shipped probes (what it
    reads before its engines start; tests/semspec/engine/test_step_engine_real.py starts them)."""
    import os
    import subprocess
    import sys

    code = ("from semspec.engine.step_engine import read_step_models\n"
            "from semspec.models.identity import models_cache\n"
            "t, d, pair = read_step_models(None, None, None, models_cache('cache'))\n"
            "assert pair is not None; print(d.shape.identity)")
    env = {k: v for k, v in os.environ.items() if k != "SEMJOBS_MODEL_CACHE"} | {"HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().startswith("embedded:smollm2-135m-draft@sha256:")
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir() if p.name.startswith("smollm2-135m-draft")]

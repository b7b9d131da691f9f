"""The default probes shipped for the embedded pairs: the target with the layer draft, and
with the draft head."""

import pytest

from semspec.calibration import default_probes_dir
from semspec.probes import ProbePair, read_metadata

PAIRS = {"smollm2-135m": "embedded:smollm2-135m-draft", "smollm2-135m-head": "embedded:smollm2-135m-head"}


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


@pytest.mark.slow
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_default_probes_fit_the_embedded_models(pair):
    from semspec.head import load_draft
    from semspec.models import load_model

    d = _shipped(pair)
    target = load_model("embedded:smollm2-135m", device="cpu")
    draft = load_draft(PAIRS[pair], target, device="cpu")
    probes = ProbePair.load(d, target, draft)  # checks hidden size, layer, content hash
    assert probes.target.hidden_size == target.hidden_size

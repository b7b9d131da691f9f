"""The default probes shipped for the embedded pair (embedded:smollm2-135m + draft)."""

import pytest

from semspec.calibration import default_probes_dir
from semspec.probes import ProbePair, read_metadata

pytestmark = pytest.mark.skipif(default_probes_dir() is None, reason="no default probes shipped yet")


def test_default_probe_files_are_well_formed():
    d = default_probes_dir()
    for role in ("target", "draft"):
        meta = read_metadata(d / f"{role}.safetensors")
        assert meta["role"] == role and meta["kind"] == "mlp"
        assert meta["training"]["split"] == "by question"
        assert meta["training"]["held_out"]["n"] > 0
        assert (d / f"{role}.safetensors").stat().st_size < 2_000_000


@pytest.mark.slow
def test_default_probes_fit_the_embedded_models():
    from semspec.models import load_model

    target = load_model("embedded:smollm2-135m", device="cpu")
    draft = load_model("embedded:smollm2-135m-draft", device="cpu")
    pair = ProbePair.load(default_probes_dir(), target, draft)  # checks hidden size, layer, content hash
    assert pair.target.hidden_size == target.hidden_size

from __future__ import annotations

import json

import pytest
import torch

from semspec.probes import Probe, ProbeError, ProbePair, read_metadata, step_features, train_probe


def _probe_for(m, **kw):
    return Probe(m.hidden_size, hidden_dims=(16,), layer=1, model_identity=str(m.identity), **kw)


def test_save_load_roundtrip(tmp_path, tiny_target):
    p = _probe_for(tiny_target, training_summary={"mse": 0.1})
    x = torch.randn(5, tiny_target.hidden_size)
    p.fit_normalization(x)
    path = p.save(tmp_path / "t.safetensors")
    meta = read_metadata(path)
    assert meta["format"] == "semjobs-probe" and meta["layer"] == 1 and meta["hidden_size"] == 64
    assert meta["model_sha256"] == tiny_target.identity.sha256 and meta["training"] == {"mse": 0.1}
    q = Probe.load(path, tiny_target)
    torch.testing.assert_close(p.eval()(x), q(x))
    assert 0.0 < q.predict(x[0]) < 1.0


def test_wrong_model_is_a_clear_error(tmp_path, tiny_target, tiny_draft, tiny_other):
    path = _probe_for(tiny_target).save(tmp_path / "t.safetensors")
    with pytest.raises(ProbeError, match="calibrated for another"):
        Probe.load(path, tiny_draft)  # same hidden size, other weights
    Probe.load(path, tiny_draft, strict_identity=False)
    wrong_h = Probe(32, layer=1).save(tmp_path / "h.safetensors")
    with pytest.raises(ProbeError, match="hidden size"):
        Probe.load(wrong_h, tiny_target)
    deep = Probe(64, layer=7).save(tmp_path / "l.safetensors")
    with pytest.raises(ProbeError, match="out of range"):
        Probe.load(deep, tiny_target)


def test_not_a_probe_file(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ProbeError, match="not a semjobs probe"):
        Probe.load(tmp_path / "x.safetensors")
    (tmp_path / "y.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ProbeError):
        Probe.load(tmp_path / "y.safetensors")
    with pytest.raises(ProbeError, match="does not exist"):
        Probe.load(tmp_path / "nope.safetensors")


def test_a_truncated_probe_file_is_a_clear_error(tmp_path, tiny_target):
    path = _probe_for(tiny_target).save(tmp_path / "t.safetensors")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a copy that stopped halfway
    with pytest.raises(ProbeError, match="cut.safetensors"):
        Probe.load(cut, tiny_target)


def test_constant_pair_roundtrip(tmp_path, tiny_target, tiny_draft):
    pair = ProbePair.always_reject(64, 64)
    pair.save(tmp_path / "probes")
    back = ProbePair.load(tmp_path / "probes", tiny_target, tiny_draft)
    x = torch.randn(3, 64)
    assert back.target(x).tolist() == [0.0] * 3 and back.draft(x).tolist() == [1.0] * 3
    assert json.loads(json.dumps(back.target.metadata()))["kind"] == "constant"


def test_step_features_match_a_full_forward(tiny_target):
    m = tiny_target
    prefix, steps = [5, 6, 7], [[8, 9], [10, 11, 12, 13]]
    feats = step_features(m, prefix, steps, layer=-1)
    assert feats.shape == (2, 64)
    for i, s in enumerate(steps):
        with torch.no_grad():
            hs = m.model(torch.tensor([prefix + s]), output_hidden_states=True).hidden_states[-1]
        torch.testing.assert_close(feats[i], hs[0, len(prefix):].mean(0), atol=1e-4, rtol=1e-4)


def test_train_probe_learns_a_simple_target():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = torch.sigmoid(2 * x[:, 0])
    p = Probe(8, hidden_dims=(16,), layer=-1)
    summary = train_probe(p, x, y, epochs=60, lr=1e-2)
    assert summary["train_mse"] < 0.01

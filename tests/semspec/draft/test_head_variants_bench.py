"""benchmarks/head_variants.py: the fused head starts as the shipped kind of head (the fusion
passes the final state through), its training loss sees the final state only, and the
agreement it reports is the unrolled levels' against the target's choices."""

import importlib.util
from pathlib import Path

import torch

from semspec.draft.config import HeadTrainConfig
from semspec.draft.head_data import Trace
from semspec.draft.head_train import head_loss
from semspec.head import HeadModel

from .conftest import tiny_target

_spec = importlib.util.spec_from_file_location(
    "head_variants", Path(__file__).resolve().parents[3] / "benchmarks" / "head_variants.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _pair():
    model = tiny_target(layers=3)
    torch.manual_seed(5)
    plain = HeadModel(model)
    torch.manual_seed(5)
    fused = bench.FusedHead(model)
    return model, plain, fused


def test_a_fresh_fusion_passes_the_final_state_through():
    model, plain, fused = _pair()
    h = model.config.hidden_size
    ids = torch.randint(3, 120, (2, 9))
    feats = torch.randn(2, 9, 3 * h)
    with torch.no_grad():
        want = plain.unrolled_forward(feats[..., -h:], ids, levels=3)
        got = fused.unrolled_forward(feats, ids, levels=3)
    for w, g in zip(want, got):
        assert g.shape[-1] == 3 * h and torch.all(g[..., :-h] == 0)  # padded in front
        torch.testing.assert_close(g[..., -h:], w)


def test_the_fused_cross_entropy_reads_the_final_state_only():
    model, plain, fused = _pair()
    h = model.config.hidden_size
    traces = [Trace(torch.randint(3, 120, (12,)).tolist(), 4, "greedy") for _ in range(2)]
    feats = [torch.randn(12, 3 * h) for _ in traces]
    w = model.get_output_embeddings().weight.detach()[:64].float()
    w3 = torch.cat([w.new_zeros(64, 2 * h), w], dim=1)
    cfg = HeadTrainConfig(input_noise=0.0, unroll=2, reg_weight=0.0, train_dtype="float32")
    with torch.no_grad():
        plain_loss, _ = head_loss(plain, w, traces, [f[:, -h:] for f in feats], cfg, None)
        fused_loss, _ = head_loss(fused, w3, traces, feats, cfg, None)
    torch.testing.assert_close(fused_loss, plain_loss)


def test_agreement_counts_the_unrolled_drafts_against_the_targets_choice():
    model, plain, _ = _pair()
    h = model.config.hidden_size
    w_full = model.get_output_embeddings().weight.detach().float()
    vocab = torch.arange(w_full.shape[0])
    trace = Trace(torch.randint(3, 120, (10,)).tolist(), 3, "greedy")
    states = torch.randn(10, h)
    with torch.no_grad():
        got = bench.agreement_by_depth(plain, [trace], [states], w_full, vocab, w_full, depths=2)
        read = torch.cat([torch.zeros(1, h), states[:9]])[None]
        preds = plain.unrolled_forward(read, torch.tensor([trace.ids]), 2)
    want = (states @ w_full.T).argmax(-1)
    for d in range(2):
        j = torch.arange(2 + d, 9)
        assert got[d] == float(((preds[d][0, j] @ w_full.T).argmax(-1) == want[j]).float().mean())

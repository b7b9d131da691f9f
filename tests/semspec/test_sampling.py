import torch

from semspec import sampling
from semspec.sampling import probs_from_logits


def _nucleus_by_full_sort(logits, temperature, top_p):
    p = torch.softmax(logits.float() / temperature, -1)
    sorted_p, idx = torch.sort(p, descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) <= top_p
    out = torch.zeros_like(p)
    out[idx[keep]] = sorted_p[keep]
    return out / out.sum()


def test_top_p_matches_full_sort_for_peaked_and_flat_distributions():
    gen = torch.Generator().manual_seed(0)
    for scale in (8.0, 3.0, 0.05):  # nucleus inside the candidates ... far beyond them
        logits = torch.randn(5000, generator=gen) * scale
        got = probs_from_logits(logits, 0.6, 0.95)
        want = _nucleus_by_full_sort(logits, 0.6, 0.95)
        assert torch.allclose(got, want, atol=1e-6)
        assert abs(float(got.sum()) - 1.0) < 1e-5


def test_flat_distribution_takes_the_full_sort_path():
    logits = torch.zeros(4 * sampling._NUCLEUS_CANDIDATES)
    got = probs_from_logits(logits, 1.0, 0.9)
    # every token is equally likely: the nucleus needs 90% of them, far more than the candidates
    assert int((got > 0).sum()) > sampling._NUCLEUS_CANDIDATES


def test_greedy_and_no_top_p():
    logits = torch.tensor([0.1, 2.0, -1.0])
    assert probs_from_logits(logits, 0.0).tolist() == [0.0, 1.0, 0.0]
    assert torch.allclose(probs_from_logits(logits, 1.0, 1.0), torch.softmax(logits, -1))

"""The batched runner against transformers' own forward: logits and tapped states, for
mixed batches (prefills, decodes, multi-token verifications) with rollbacks, on every
served layout."""

from __future__ import annotations

import pytest
import torch

from semspec.models import load_model
from semspec.runner import ContextOverflow, Feed, ModelRunner, UnsupportedModel
from semspec.testing import ARCHITECTURES, tiny_model_dir

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_model(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"runner-{request.param}")
    path = tiny_model_dir(root / "m", num_layers=3, seed=3, arch=request.param, max_positions=128)
    return load_model(str(path), device="cpu", cache_dir=root / "cache")


def _reference(lm, ids):
    with torch.no_grad():
        out = lm.model(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0].float(), [h[0].float() for h in out.hidden_states]


@pytest.mark.parametrize("tap", [0, 2, -1])
def test_mixed_batches_with_rollbacks_match_transformers(arch_model, tap):
    lm = arch_model
    assert lm.model.config.model_type in ARCHITECTURES
    r = ModelRunner(lm, slots=4, tap_layer=tap, capacity=8)  # small: the cache grows mid-run
    seqs = {"a": list(range(5, 30)), "b": list(range(40, 47)), "c": [9, 9, 9]}
    slot = {k: r.alloc() for k in seqs}

    def check(out, i, key, n_rows, tapped):
        logits, states = _reference(lm, seqs[key])
        got = out.logits[out.row_start[i]: out.row_start[i] + n_rows]
        torch.testing.assert_close(got, logits[-n_rows:], **TOL)
        if tapped:
            n = out.hidden[i].shape[0]
            torch.testing.assert_close(out.hidden[i], states[tap][-n:], **TOL)
        else:
            assert out.hidden[i] is None

    out = r.forward([Feed(slot[k], v, [len(v) - 1], tap=True) for k, v in seqs.items()])  # prefills
    for i, k in enumerate(seqs):
        check(out, i, k, 1, True)
    # a decode, a 3-token verification, and a rollback of two tokens followed by new ones
    seqs["a"] += [50]
    seqs["b"] += [51, 52, 53]
    r.set_length(slot["c"], 1)
    seqs["c"] = seqs["c"][:1] + [60, 61]
    out = r.forward([Feed(slot["a"], [50], [0]), Feed(slot["b"], [51, 52, 53], [0, 1, 2], tap=True),
                     Feed(slot["c"], [60, 61], [1], tap=True)])
    check(out, 0, "a", 1, False)
    check(out, 1, "b", 3, True)
    check(out, 2, "c", 1, True)
    # decodes only, one slot idle between them, a verified step rolled back in another
    r.set_length(slot["b"], len(seqs["b"]) - 2)
    seqs["b"] = seqs["b"][:-2]
    seqs["c"] += [7]
    seqs["a"] += [8]
    out = r.forward([Feed(slot["c"], [7], [0]), Feed(slot["a"], [8], [0])])
    check(out, 0, "c", 1, False)
    check(out, 1, "a", 1, False)
    out = r.forward([Feed(slot["b"], [70, 71], [0, 1])])
    seqs["b"] += [70, 71]
    check(out, 0, "b", 2, False)
    assert r.lengths[slot["b"]] == len(seqs["b"]) and r.passes == 4


def test_a_copied_prefix_decodes_as_if_prefilled(arch_model):
    lm = arch_model
    r = ModelRunner(lm, slots=3, capacity=8)
    prompt = list(range(5, 80))  # beyond the first 64 positions: the cache grows inside the pass
    assert r.capacity < len(prompt)
    donor, other = r.alloc(), r.alloc()
    r.forward([Feed(donor, prompt, [len(prompt) - 1])])
    r.copy_prefix(donor, other, len(prompt) - 1)
    assert r.lengths[other] == len(prompt) - 1
    out = r.forward([Feed(other, prompt[-1:] + [40], [0, 1]), Feed(donor, [41], [0])])
    torch.testing.assert_close(out.logits[:2], _reference(lm, prompt + [40])[0][-2:], **TOL)
    torch.testing.assert_close(out.logits[2], _reference(lm, prompt + [41])[0][-1], **TOL)
    with pytest.raises(ValueError):
        r.copy_prefix(donor, other, len(prompt) + 5)  # more than the donor holds


def test_freed_slot_starts_empty_and_context_is_enforced(arch_model):
    lm = arch_model
    r = ModelRunner(lm, slots=2)
    s = r.alloc()
    r.forward([Feed(s, list(range(5, 25)), [19])])
    r.free(s)
    s2 = r.alloc()
    assert r.lengths[s2] == 0
    out = r.forward([Feed(s2, [5, 6, 7], [2])])
    torch.testing.assert_close(out.logits[0], _reference(lm, [5, 6, 7])[0][-1], **TOL)
    with pytest.raises(ContextOverflow):
        r.forward([Feed(s2, [5] * 126, [0])])
    with pytest.raises(ValueError):
        r.set_length(s2, 4)  # beyond what is cached


def test_reduced_vocabulary_head(tiny_target):
    import dataclasses

    ids = torch.tensor([3, 10, 11, 200], dtype=torch.long)
    lm = dataclasses.replace(tiny_target, vocab_ids=ids)
    r = ModelRunner(lm, slots=1)
    out = r.forward([Feed(r.alloc(), [5, 6, 7], [2])])
    full = _reference(tiny_target, [5, 6, 7])[0][-1]
    torch.testing.assert_close(out.logits[0][ids], full[ids], **TOL)
    assert torch.isinf(out.logits[0]).sum() == out.logits.shape[1] - len(ids)


def test_unsupported_layout_is_refused(tiny_target):
    import copy
    import dataclasses

    model = copy.copy(tiny_target.model)
    model.config = copy.deepcopy(tiny_target.model.config)
    model.config.model_type = "gpt2"
    with pytest.raises(UnsupportedModel, match="gpt2"):
        ModelRunner(dataclasses.replace(tiny_target, model=model), slots=1)

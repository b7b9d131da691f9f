"""The EAGLE-style draft head: its training forward is transformers' own decoder layers, its
unrolled levels are the head's own drafts, and its artifact round-trips and is refused by
another target. (vLLM runs the exported head: tests/semspec/engine/test_speculation.py.)"""

from __future__ import annotations

import pytest
import torch

from semspec.head import HeadMismatchError, HeadModel, is_head, load_draft, load_head, save_head
from semspec.models.identity import ModelIdentity
from semspec.models.loaded import LoadedModel


def _head_model(target: LoadedModel, seed: int = 3) -> LoadedModel:
    torch.manual_seed(seed)
    head = HeadModel(target.model, layers=1)
    with torch.no_grad():  # a head that is not the identity, so drafts differ from the target
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    head.eval()
    return LoadedModel(head, target.tokenizer, ModelIdentity("test-head", "0" * 64), target.device,
                       target.dtype, spec="test-head")


@pytest.fixture(scope="module")
def head(tiny_target):
    return _head_model(tiny_target)


def _layer_reference(head: HeadModel, states_in: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The head's teacher-forced pass through transformers' own decoder layers (the reference)."""
    length = ids.shape[1]
    x = head.fuse_inputs(states_in, head.embed_tokens(ids))
    pos = torch.arange(length)[None]
    cos, sin = head.rotary_emb(x, pos)
    causal = torch.full((length, length), float("-inf")).triu(1)[None, None]
    for layer in head.layers:
        out = layer(x, attention_mask=causal, position_ids=pos, position_embeddings=(cos, sin))
        x = out[0] if isinstance(out, tuple) else out
    return head.norm(x)


def test_the_first_level_is_the_decoder_layers_own_pass(head, tiny_target):
    torch.manual_seed(0)
    ids = torch.randint(5, 300, (1, 12))
    states = torch.randn(1, 12, tiny_target.hidden_size)
    with torch.no_grad():
        want = _layer_reference(head.model, states, ids)[0]
        (level1,) = head.model.unrolled_forward(states, ids)
    torch.testing.assert_close(level1[0], want, atol=1e-4, rtol=1e-4)


def test_unrolled_levels_are_the_heads_own_drafts(head, tiny_target):
    """Level m of the training forward at position j is what the head drafts m tokens after it
    last read a target state (at s = j - m + 1): the reference reruns the decoder layers over
    positions 0..j, reading the target's states up to s and its own predictions after."""
    torch.manual_seed(1)
    ids = torch.randint(5, 300, (2, 11))
    states = torch.randn(2, 11, tiny_target.hidden_size)
    with torch.no_grad():
        levels = head.model.unrolled_forward(states, ids, levels=4)
        checked = 0
        for b in range(2):
            for start in range(0, 8):
                read = states[b:b + 1, :start + 1]
                for m in range(1, 5):
                    j = start + m - 1
                    pred = _layer_reference(head.model, read, ids[b:b + 1, :j + 1])[0, -1]
                    torch.testing.assert_close(pred, levels[m - 1][b, j], atol=1e-4, rtol=1e-4)
                    read = torch.cat([read, pred[None, None]], dim=1)  # the next position reads it
                    checked += 1
    assert checked == 2 * 8 * 4  # every start reaches depth 4 inside the 11 positions


def test_artifact_round_trip_and_target_check(head, tiny_target, tiny_draft, tmp_path):
    vocab = torch.arange(0, 200)
    save_head(head.model, vocab, {"target": __import__("semspec.head", fromlist=["x"]).target_fingerprint(
        tiny_target.model), "training": {"steps": 0}}, tmp_path / "h")
    loaded = load_head(tmp_path / "h", tiny_target)
    assert is_head(loaded) and loaded.vocab_ids.tolist() == vocab.tolist()
    for (k, a), b in zip(head.model.trained_state().items(), loaded.model.trained_state().values()):
        torch.testing.assert_close(a.half().float(), b.float(), msg=k)
    with pytest.raises(HeadMismatchError):
        load_head(tmp_path / "h", tiny_draft)  # another model (1 layer): refused
    assert is_head(load_draft(str(tmp_path / "h"), tiny_target))  # a draft spec naming the directory

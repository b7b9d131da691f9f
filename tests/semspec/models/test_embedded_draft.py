"""The committed draft artifact for the embedded SmolLM2 target."""

import pytest
import torch

from semspec.models.draft_artifact import META_FILE, WEIGHTS_FILE, load_artifact
from semspec.models.embedded_draft import ARTIFACT_DIR


def test_committed_artifact_shapes_and_size():
    art = load_artifact(ARTIFACT_DIR)
    sig = art.meta["target"]["signature"]
    assert (sig["hidden_size"], sig["num_hidden_layers"], sig["vocab_size"]) == (576, 30, 49152)
    assert 1 <= art.frozen_layers and art.adapter_layers >= 1
    assert art.num_layers <= 10  # the cost budget: at most a third of the target's 30 layers
    assert art.vocab_ids is not None and art.meta["draft_vocab_size"] == len(art.vocab_ids) <= 16384
    assert art.tensors["norm.weight"].shape == (576,)
    for j in range(art.adapter_layers):
        assert art.tensors[f"layers.{j}.self_attn.q_proj.weight"].shape == (576, 576)
        assert art.tensors[f"layers.{j}.self_attn.k_proj.weight"].shape == (192, 576)
        assert art.tensors[f"layers.{j}.mlp.up_proj.weight"].shape == (1536, 576)
    assert all(torch.isfinite(t.float()).all() for t in art.tensors.values())
    size = sum((ARTIFACT_DIR / f).stat().st_size for f in (META_FILE, WEIGHTS_FILE))
    assert size <= 20_000_000
    cfg = art.meta["config"]
    assert cfg["holdout"] >= 100 and "seed" in cfg  # never trained on the benchmark slice
    assert art.meta["training"]["eval_after"]["top1_agreement"] > art.meta["training"]["eval_before"]["top1_agreement"]


@pytest.mark.real_model
@pytest.mark.slow
def test_embedded_draft_loads_like_any_model():
    from semspec.models.loaded import load_model

    target = load_model("embedded:smollm2-135m", device="cpu", dtype=torch.float32)
    draft = load_model("embedded:smollm2-135m-draft", device="cpu", dtype=torch.float32)
    art = load_artifact(ARTIFACT_DIR)
    assert draft.num_layers == art.num_layers
    assert draft.tokenizer.get_vocab() == target.tokenizer.get_vocab()
    torch.testing.assert_close(draft.model.model.layers[0].mlp.up_proj.weight,
                               target.model.model.layers[0].mlp.up_proj.weight)
    torch.testing.assert_close(draft.model.lm_head.weight, target.model.lm_head.weight)
    ids = torch.tensor([target.tokenizer("Janet has 3 apples and buys 4 more, so she has")["input_ids"]])
    with torch.no_grad():
        logits = draft.model(ids).logits
    assert torch.isfinite(logits).all()
    # the reduced vocabulary travels with the materialised directory
    assert art.vocab_ids is not None and torch.equal(draft.vocab_ids, art.vocab_ids)
    reduced, _ = draft.forward(ids, None, False, keep=1)
    assert int(torch.isfinite(reduced).sum()) == len(art.vocab_ids)
    assert int(reduced.argmax()) in set(art.vocab_ids.tolist())

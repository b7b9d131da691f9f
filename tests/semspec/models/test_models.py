from __future__ import annotations

import time

import pytest
import torch

from semspec.models.identity import content_sha256
from semspec.models.loaded import load_model, truncated_copy
from semspec.models.paths import ModelLoadError
from semspec.models.specs import resolve_spec
from semspec.prompts import encode_prompt, render_prompt


def test_load_local_dir_identity(tiny_dirs, tiny_cache):
    m = load_model(str(tiny_dirs["target"]), device="cpu", cache_dir=tiny_cache)
    assert m.device.type == "cpu" and m.dtype == torch.float32
    assert m.identity.name == str(tiny_dirs["target"])
    assert len(m.identity.sha256) == 64
    assert str(m.identity) == f"{m.identity.name}@sha256:{m.identity.sha256}"
    # memoised and stable; different weights -> different hash
    assert content_sha256(tiny_dirs["target"], tiny_cache) == m.identity.sha256
    assert content_sha256(tiny_dirs["draft"], tiny_cache) != m.identity.sha256
    assert m.hidden_size == 64 and m.num_layers == 2 and m.max_context == 512
    assert m.tokenizer.eos_token_id in m.eos_token_ids


def test_a_directory_is_the_same_model_wherever_it_lies_and_whoever_wrote_its_config(tiny_dirs, tmp_path):
    import shutil

    from semspec.models.identity import ModelIdentity
    from semspec.models.specs import spec_sha256

    copy = shutil.copytree(tiny_dirs["target"], tmp_path / "elsewhere" / "target")
    config = copy / "config.json"
    config.write_text(config.read_text().replace('"transformers_version"', '"transformers_version_was"'))
    a = spec_sha256(str(tiny_dirs["target"]), tmp_path / "cache_a")
    b = spec_sha256(str(copy), tmp_path / "cache_b")
    assert a == b  # another path, cache and config.json: the same weights, the same model
    assert ModelIdentity("x", a) == ModelIdentity("y", b)
    assert spec_sha256(str(tiny_dirs["draft"]), tmp_path / "cache_a") != a


def test_resolve_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_spec(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="unknown embedded"):
        resolve_spec("embedded:nothing")
    with pytest.raises(ModelLoadError, match="not a model directory"):
        resolve_spec(tmp_path)
    assert resolve_spec(None).kind == "gguf"
    assert resolve_spec("embedded:smollm2-135m").path.name.endswith(".gguf")


def test_chat_template(tiny_target):
    tok = tiny_target.tokenizer
    text = render_prompt(tok, "What is 2+2?")
    assert text.endswith("<|im_start|>assistant\n") and "What is 2+2?" in text
    ids = encode_prompt(tok, [{"role": "user", "content": "What is 2+2?"}])
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    with pytest.raises(ValueError, match="empty prompt"):
        render_prompt(tok, "")
    with pytest.raises(ValueError, match="empty prompt"):
        render_prompt(tok, [])


def test_chat_template_kwargs_reach_the_template_and_the_prompts_ids(tiny_target):
    from semspec.prompts import prompt_ids

    tok = tiny_target.tokenizer
    assert render_prompt(tok, "q", template_kwargs={"enable_thinking": True}).endswith("assistant\n<think>\n")
    assert not render_prompt(tok, "q").endswith("<think>\n")
    plain, thinking = (prompt_ids(tok, "What is 2+2?", kw, None) for kw in (None, {"enable_thinking": True}))
    assert len(thinking) > len(plain)


def test_truncated_copy_matches_first_layers(tiny_target):
    d = truncated_copy(tiny_target, 1)
    assert d.num_layers == 1 and d.tokenizer is tiny_target.tokenizer
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        h_full = tiny_target.model(ids, output_hidden_states=True).hidden_states[1]
        h_cut = d.model.model(ids, output_hidden_states=True).hidden_states[1]
        # the last hidden state is reported after the final norm
        h_full = tiny_target.model.model.norm(h_full)
    torch.testing.assert_close(h_full, h_cut)


@pytest.mark.real_model
@pytest.mark.slow
def test_embedded_gguf_conversion_is_cached(tmp_path):
    t0 = time.time()
    m1 = load_model(None, device="cpu", cache_dir=tmp_path)
    first = time.time() - t0
    cached = [p for p in tmp_path.iterdir() if p.name.startswith("smollm2-135m-")]
    assert len(cached) == 1 and (cached[0] / "model.safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    t0 = time.time()
    m2 = load_model("embedded:smollm2-135m", device="cpu", cache_dir=tmp_path)
    second = time.time() - t0
    assert second < 5.0, (first, second)
    assert m1.identity == m2.identity and m1.identity.name == "embedded:smollm2-135m"
    assert m2.hidden_size == 576 and m2.num_layers == 30
    ids = encode_prompt(m2.tokenizer, "What is 2+2?")
    with torch.no_grad():
        a = m1.model(torch.tensor([ids])).logits
        b = m2.model(torch.tensor([ids])).logits
    torch.testing.assert_close(a, b)


def test_register_embedded(tiny_dirs, tiny_cache):
    from semspec.models.specs import EMBEDDED_MODELS, register_embedded

    seen = []
    register_embedded("tiny-test", lambda cache_dir: seen.append(cache_dir) or tiny_dirs["draft"])
    register_embedded("tiny-test0", lambda: tiny_dirs["draft"])
    try:
        m = load_model("embedded:tiny-test", device="cpu", cache_dir=tiny_cache)
        assert m.num_layers == 1 and seen == [tiny_cache]
        assert resolve_spec("embedded:tiny-test0").path == tiny_dirs["draft"].resolve()
    finally:
        EMBEDDED_MODELS.pop("tiny-test")
        EMBEDDED_MODELS.pop("tiny-test0")


def test_reduced_head_swaps_the_lm_head_for_the_block_only(tiny_target):
    import dataclasses

    allowed = torch.tensor([3, 7, 11, 40, 41])
    sub = dataclasses.replace(tiny_target, vocab_ids=allowed)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        full = tiny_target.model(ids).logits[0, -1]
        with sub.reduced_head() as model:
            reduced = model(ids).logits[0, -1]
        after = tiny_target.model(ids).logits[0, -1]
    assert int(torch.isfinite(reduced).sum()) == len(allowed)
    torch.testing.assert_close(reduced[allowed], full[allowed], atol=1e-5, rtol=1e-5)
    # the same logits as the engine's own path, and the full head is back afterwards
    engine_logits, _ = sub.forward(ids, None, False, keep=1)
    torch.testing.assert_close(engine_logits[-1], reduced, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after, full)
    with tiny_target.reduced_head() as model:  # a full-vocabulary model is left alone
        assert model.get_output_embeddings() is tiny_target.model.get_output_embeddings()


def test_the_reduced_head_scores_its_own_rows_only(tiny_target):
    import dataclasses

    sub = dataclasses.replace(tiny_target, vocab_ids=torch.arange(3, 3 + 16))
    hidden = torch.randn(1, sub.hidden_size)
    with torch.inference_mode():
        logits = sub.head_logits(hidden)
        again = sub.head_logits(hidden)
    full = tiny_target.head_logits(hidden)
    torch.testing.assert_close(logits[0, 3:19], full[0, 3:19], atol=1e-5, rtol=1e-5)
    assert torch.equal(logits, again) and int(torch.isfinite(logits).sum()) == 16


def test_pick_dtype(monkeypatch):
    import torch

    from semspec.models import dtypes

    assert dtypes.pick_dtype("cpu", 32, "float32") is torch.float32
    assert dtypes.pick_dtype("cpu", 1, "bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        dtypes.pick_dtype("cpu", 1, "float16")
    monkeypatch.setattr(dtypes, "cpu_has_fast_bf16", lambda: True)
    assert dtypes.pick_dtype("cpu", 1) is torch.float32  # one sequence: float32 is faster
    assert dtypes.pick_dtype("cpu", dtypes.BF16_MIN_BATCH - 1) is torch.float32
    assert dtypes.pick_dtype("cpu", dtypes.BF16_MIN_BATCH) is torch.bfloat16
    monkeypatch.setattr(dtypes, "cpu_has_fast_bf16", lambda: False)
    assert dtypes.pick_dtype("cpu", 32) is torch.float32


def test_a_pickled_checkpoint_is_refused(tiny_dirs, tiny_cache, tmp_path):
    """Only safetensors weights load: unpickling a pytorch_model.bin can run code."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = tiny_dirs["target"]
    pickled = tmp_path / "pickled"
    model = AutoModelForCausalLM.from_pretrained(src)
    model.save_pretrained(pickled)
    AutoTokenizer.from_pretrained(src).save_pretrained(pickled)
    for f in pickled.glob("*.safetensors"):  # the same weights, as a pickle
        f.unlink()
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="no .safetensors weights; pickled checkpoints are not loaded"):
        load_model(str(pickled), device="cpu", cache_dir=tiny_cache)


def test_weights_per_pass_skip_the_input_embedding_and_count_the_reduced_head_rows(tiny_target):
    import dataclasses

    model = tiny_target.model
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    everything = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    tied = head is embed  # one matrix: read as the LM head, not as the embedding
    assert tiny_target.weights_per_pass == everything - (0 if tied else embed.numel())
    sub = dataclasses.replace(tiny_target, vocab_ids=torch.tensor([3, 7, 11]))
    assert tiny_target.weights_per_pass - sub.weights_per_pass == (head.shape[0] - 3) * head.shape[1]

"""The draft head trained here, drafting in vLLM for each target family it supports
(semspec.engine.head_model, ``HEAD_MODEL_TYPES``): on a tiny random Llama, Qwen2 (biases on
q/k/v) and Qwen3 (q/k norms) target, vLLM runs the head as its training forward does
(``HeadModel.unrolled_forward``) on the same inputs, which a drafter built with another
family's layer fails, and token_sd with it writes the target's own greedy text. A head of
another family is refused before an engine starts. One engine at a time, module-scoped per
family: vLLM keeps per-process state, and each start takes seconds."""

from __future__ import annotations

import gc
import json
import shutil

import pytest
import torch

from semspec.engine.head_plugin import EXPORT_FORMAT, HEAD_MODEL_TYPES, export_head
from semspec.engine.speculation import draft_problem
from semspec.engine.token_engine import VLLMEngine
from semspec.prompts import encode_prompt
from semspec.types import GenerationConfig
from tests.conftest import require_vllm, tiny_vllm_model
from tests.semspec.conftest import greedy_reference
from tests.semspec.engine.test_speculation import GREEDY, PROMPTS, write_head

# a prompt no other request here shares a cached block with: the drafter's first pass then
# reads it whole, from position 0
FRESH_PROMPT = "Natalia sold clips to 48 of her friends in April, and then half as many in May."


@pytest.fixture(scope="module", params=HEAD_MODEL_TYPES)
def family(request, tiny_vllm_dir, tmp_path_factory):
    """(the family's model_type, a tiny target of it, write_head's head on that target)."""
    target = tiny_vllm_dir if request.param == "llama" else tiny_vllm_model(tmp_path_factory, request.param)
    return request.param, target, write_head(tmp_path_factory.mktemp(f"head-{request.param}"), target)


@pytest.fixture(scope="module")
def engine(family, tiny_cache):
    """An engine on the family's target drafting 3 tokens with its head, one request at a time
    (an engine on a CPU drafts while one request runs: token_engine.engine_arguments)."""
    require_vllm()
    _, target, head = family
    eng = VLLMEngine.load(str(target), draft=str(head), device="cpu", cache_dir=tiny_cache, dtype="float32",
                          batch_size=1, kv_cache_gb=0.25, speculative_tokens=3)
    yield eng
    del eng
    gc.collect()


def test_vllm_runs_the_head_as_its_training_forward(family, engine, tiny_cache):
    """The drafter's first pass over a prompt -- (token i + 1, the target's state at i) at
    position i -- gives the states the head's training forward gives for the same pairs."""
    from semspec.head import load_head
    from semspec.models.loaded import load_model

    _, target_dir, head_dir = family
    [drafter] = engine.llm.collective_rpc(lambda worker: worker.model_runner.drafter.model)
    passes = []
    hook = drafter.model.register_forward_hook(
        lambda module, args, out: passes.append([t.detach().clone() for t in (*args, out[0])]))
    try:
        engine.generate(FRESH_PROMPT, GenerationConfig(method="token_sd", max_new_tokens=2, draft_tokens=3))
    finally:
        hook.remove()
    target = load_model(str(target_dir), device="cpu", cache_dir=tiny_cache, dtype=torch.float32)
    prompt = encode_prompt(target.tokenizer, FRESH_PROMPT)
    n = len(prompt)
    ids, positions, states, out = passes[0]
    assert positions[:n].tolist() == list(range(n)) and ids[:n - 1].tolist() == prompt[1:]
    head = load_head(head_dir, target)
    with torch.no_grad():
        (trained,) = head.model.unrolled_forward(states[None, :n], ids[None, :n], levels=1)
    torch.testing.assert_close(out[:n], trained[0], rtol=1e-4, atol=1e-4)


def test_token_sd_with_the_head_writes_the_targets_greedy_text(family, engine, tiny_cache):
    _, target_dir, _ = family
    greedy = greedy_reference(target_dir, tiny_cache)
    drafted = 0
    for prompt in PROMPTS:
        mine = engine.generate(prompt, GREEDY)
        assert (mine.text, mine.finish_reason) == greedy(prompt, GREEDY.max_new_tokens)[:2]
        drafted += mine.counters.drafted_tokens
    assert drafted > 0 and engine.speculation.method == "eagle"


def test_the_export_keeps_the_targets_family(family, tmp_path):
    """vLLM builds the head's layers from the exported config as the target's: its model_type,
    rope, biases and head widths are the target's."""
    _, target_dir, head_dir = family
    exported = json.loads((export_head(head_dir, target_dir, tmp_path / "export") / "config.json").read_text())
    target = json.loads((target_dir / "config.json").read_text())
    kept = ("model_type", "rope_parameters", "attention_bias", "head_dim", "hidden_size", "num_attention_heads",
            "num_key_value_heads", "rms_norm_eps")
    assert {k: exported.get(k) for k in kept} == {k: target.get(k) for k in kept}
    layer_types = target.get("layer_types")  # Qwen's configs have them, Llama's not
    assert (exported["num_hidden_layers"], exported.get("layer_types")) == (1, layer_types and layer_types[-1:])


def test_the_export_drops_the_targets_quantization_and_replaces_an_older_format(family, tmp_path):
    """The head's weights are float whatever the target's are: an export that named the target's
    quantization would have vLLM build the head's layers quantized, which its weights cannot
    load into. An export written in an older format is written again."""
    _, target_dir, head_dir = family
    quantized = tmp_path / "target"
    shutil.copytree(target_dir, quantized)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (quantized / "config.json").write_text(json.dumps(config))
    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"semspec_format": "semspec-head-vllm/1", "quantization_config": {}}))
    (out / "model.safetensors").write_bytes(b"stale")
    exported = json.loads((export_head(head_dir, quantized, out) / "config.json").read_text())
    assert "quantization_config" not in exported and exported["semspec_format"] == EXPORT_FORMAT
    assert (out / "model.safetensors").read_bytes() != b"stale"


def test_the_heads_layers_take_the_drafts_quantization_not_the_targets(family, engine):
    """vLLM builds the head's layers under the engine's config, whose quantization is the
    target's; they take the draft's (none for a head made here), as vLLM's own EAGLE layers do.
    (``engine``: a running engine has set up vLLM's parallel groups, which layers read.)"""
    import copy

    from transformers import AutoConfig
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from semspec.engine.head_model import DECODER_LAYERS

    model_type, target_dir, _ = family
    vllm_config = copy.copy(engine.llm.vllm_config)  # its speculative config names the head
    vllm_config.quant_config = Fp8Config()  # as if the target were served in FP8
    with set_current_vllm_config(vllm_config):
        # a name no layer of the running engine has
        layer = DECODER_LAYERS[model_type](vllm_config, AutoConfig.from_pretrained(target_dir), "quant_check.layers.99")
    assert isinstance(layer.mlp.gate_up_proj.quant_method, UnquantizedLinearMethod)


def test_every_family_listed_has_its_layer_in_vllm():
    require_vllm()
    from semspec.engine.head_model import DECODER_LAYERS

    assert tuple(DECODER_LAYERS) == HEAD_MODEL_TYPES


def test_a_head_of_another_family_is_refused_before_an_engine_starts(tmp_path):
    (tmp_path / "head.json").write_text(json.dumps({"target": {"signature": {"model_type": "gemma"}}}))
    assert draft_problem(str(tmp_path), "some/model") == (
        f"token_sd cannot draft with {str(tmp_path)!r}: vLLM runs heads trained here on llama, qwen2, qwen3 "
        "targets (this one was trained on a gemma one)")

"""Which engine arguments serve a model with a reduced vocabulary (semspec.engine.reduced_vocab_plugin):
the directory's own architecture replaced by ours through ``hf_overrides``, the user's overrides
kept beside it, a model without the file left alone, and what cannot run refused; decoding
with it: test_reduced_vocab_model.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from semspec.engine import reduced_vocab_plugin
from semspec.engine.engine_args import check
from semspec.models.reduced_vocab import VOCAB_SUBSET_FILE
from tests.conftest import require_vllm

LLAMA = SimpleNamespace(architectures=["LlamaForCausalLM"])


@pytest.fixture
def reduced_dir(tmp_path):
    (tmp_path / VOCAB_SUBSET_FILE).write_text(json.dumps({"token_ids": [3, 5, 8]}))
    return tmp_path


def test_a_model_without_a_reduced_vocabulary_keeps_the_users_arguments(tmp_path):
    user = {"max_model_len": 512, "hf_overrides": {"rope_theta": 1.0}}
    assert reduced_vocab_plugin.engine_args(tmp_path, LLAMA, user) is user
    assert reduced_vocab_plugin.engine_args(tmp_path, LLAMA, None) is None


def test_a_reduced_vocabulary_names_our_class_of_its_architecture_which_the_plugin_registers(reduced_dir):
    require_vllm()
    from vllm import ModelRegistry

    from semspec.engine.head_plugin import register

    register()  # what every engine process runs (the vllm.general_plugins entry point)
    for family in ("Llama", "Qwen2", "Qwen3"):
        args = reduced_vocab_plugin.engine_args(reduced_dir, SimpleNamespace(architectures=[f"{family}ForCausalLM"]),
                                                None)
        ours = f"SemspecReducedVocab{family}ForCausalLM"
        assert args == {"hf_overrides": {"architectures": [ours]}}
        assert ours in ModelRegistry.get_supported_archs()
        assert check(args, "draft engine arguments")  # what engine_arguments checks them with


def test_the_users_own_overrides_stay_beside_ours_and_win(reduced_dir):
    user = {"max_model_len": 512, "hf_overrides": {"rope_theta": 1.0}}
    args = reduced_vocab_plugin.engine_args(reduced_dir, LLAMA, user)
    assert args == {"max_model_len": 512,
                    "hf_overrides": {"architectures": ["SemspecReducedVocabLlamaForCausalLM"], "rope_theta": 1.0}}
    assert user == {"max_model_len": 512, "hf_overrides": {"rope_theta": 1.0}}  # not changed in place
    theirs = reduced_vocab_plugin.engine_args(reduced_dir, LLAMA, {"hf_overrides": {"architectures": ["X"]}})
    assert theirs["hf_overrides"] == {"architectures": ["X"]}


@pytest.mark.parametrize("config, user, why", [
    (SimpleNamespace(architectures=["MistralForCausalLM"]), None, "LlamaForCausalLM, Qwen2ForCausalLM"),
    (SimpleNamespace(architectures=None), None, "not []"),
    (LLAMA, {"tensor_parallel_size": 2}, "one device, not {'tensor_parallel_size': 2}"),
    (LLAMA, {"pipeline_parallel_size": 2, "tensor_parallel_size": 1}, "not {'pipeline_parallel_size': 2}"),
])
def test_what_cannot_run_with_its_reduced_vocabulary_is_refused(reduced_dir, config, user, why):
    with pytest.raises(ValueError, match="reduced vocabulary") as refused:
        reduced_vocab_plugin.engine_args(reduced_dir, config, user)
    assert why in str(refused.value)

"""The draft head's architecture in vLLM's terms (``semspec.engine.head_plugin`` says why it is ours).
Imported by vLLM's model registry only, when an engine loads an exported head.

Per drafted position: ``fc`` (with its bias) fuses the token's embedding with the state the
head reads, the head's decoder layer(s) run as the target's own (input norm included: vLLM's
layer of the target's family, ``DECODER_LAYERS``), and the final norm gives the predicted
state: both the one the LM head reads and the one the next drafted position reads. Logits are
the target's LM head (shared by vLLM) restricted to the head's reduced vocabulary, as in its
training.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.model_executor.models.llama_eagle import EagleLlamaForCausalLM
from vllm.model_executor.models.llama_eagle import LlamaDecoderLayer as EagleLlamaDecoderLayer
from vllm.model_executor.models.qwen2 import Qwen2DecoderLayer
from vllm.model_executor.models.qwen3 import Qwen3DecoderLayer
from vllm.model_executor.models.utils import (AutoWeightsLoader, WeightsMapper, get_draft_quant_config, maybe_prefix,
                                              process_eagle_weight)

from semspec.models.reduced_vocab import full_vocab_logits


# The head's layers are quantized as the head is (its own config: none for heads made here),
# never as the target: a target served in FP8 or AWQ would otherwise build quantized layers
# the head's float weights cannot load into (vLLM's own EAGLE layers do the same)
def _llama_layer(vllm_config: VllmConfig, config, prefix: str) -> nn.Module:
    return EagleLlamaDecoderLayer(vllm_config, disable_input_layernorm=False, prefix=prefix, config=config)


def _qwen_layer(layer_class: type[nn.Module]):
    # Qwen2's and Qwen3's layers take the parts of vLLM's config they read, as their models pass them
    def build(vllm_config: VllmConfig, config, prefix: str) -> nn.Module:
        return layer_class(config=config, cache_config=vllm_config.cache_config,
                           quant_config=get_draft_quant_config(vllm_config), prefix=prefix)
    return build


# a target family (transformers' model_type) -> its decoder layer in vLLM: Qwen2's has biases on
# q/k/v, Qwen3's norms q and k per head (and reads head_dim from the config), as in training.
# Its keys are head_plugin.HEAD_MODEL_TYPES (tests/semspec/engine/test_head_model.py)
DECODER_LAYERS = {"llama": _llama_layer, "qwen2": _qwen_layer(Qwen2DecoderLayer),
                  "qwen3": _qwen_layer(Qwen3DecoderLayer)}


def target_family(config) -> str:
    """The model_type of the target the head was trained on: vLLM's eagle method wraps the
    exported config (the target's) in its own (model_type "eagle"), which keeps it as ``model``."""
    return getattr(config, "model", config).model_type


class SemspecHeadModel(nn.Module):
    # the checkpoint holds transformers' separate projections (and Qwen2's biases on them);
    # vLLM's layers of every family in DECODER_LAYERS stack them under these names
    hf_to_vllm_mapper = WeightsMapper(orig_to_new_stacked={
        ".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
        ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1),
    })

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", start_layer_id: int = 0):
        super().__init__()
        self.config = config = vllm_config.speculative_config.draft_model_config.hf_config
        hidden = int(config.hidden_size)
        # replaced by the target's embedding when the checkpoint has none (it has none)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, hidden, prefix=maybe_prefix(prefix, "embed_tokens"))
        # a head of a family not listed never gets here: speculation.draft_problem refuses it
        layer = DECODER_LAYERS[target_family(config)]
        # attention layer names must not collide with the target's: number them after its layers
        self.layers = nn.ModuleList([
            layer(vllm_config, config, maybe_prefix(prefix, f"layers.{i + start_layer_id}"))
            for i in range(int(config.num_hidden_layers))
        ])
        self.fc = ReplicatedLinear(2 * hidden, hidden, bias=True, params_dtype=vllm_config.model_config.dtype,
                                   prefix=maybe_prefix(prefix, "fc"), return_bias=False)
        self.norm = RMSNorm(hidden, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fc(torch.cat((self.embed_tokens(input_ids), hidden_states), dim=-1))
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x, x

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


class EagleSemspecHeadForCausalLM(EagleLlamaForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        nn.Module.__init__(self)
        self.config = vllm_config.speculative_config.draft_model_config.hf_config
        self.config.draft_vocab_size = self.config.vocab_size
        self.model = SemspecHeadModel(
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"),
            start_layer_id=vllm_config.model_config.get_num_layers(vllm_config.parallel_config))
        self.logits_processor = LogitsProcessor(self.config.vocab_size, scale=getattr(self.config, "logit_scale", 1.0))
        # the target tokens the head drafts (its reduced vocabulary), loaded from the checkpoint
        self.register_buffer("vocab_ids", torch.zeros(0, dtype=torch.long), persistent=False)
        self._rows: torch.Tensor | None = None

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Logits over the target's vocabulary, computed for the head's tokens only (-inf for
        the rest): the LM head's rows read per drafted token are what a draft pass costs most."""
        if self.vocab_ids.numel() == 0:
            return self.logits_processor(self.lm_head, hidden_states)
        if self._rows is None:  # the LM head is the target's, shared after loading
            self._rows = self.lm_head.weight[self.vocab_ids].contiguous()
        return full_vocab_logits(hidden_states @ self._rows.T, self.vocab_ids, self.config.vocab_size)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        rest = []
        for name, tensor in weights:
            if name == "vocab_ids":
                self.vocab_ids = tensor.to(device=self.vocab_ids.device, dtype=torch.long)
                continue
            name = name if "lm_head" in name else "model." + name
            process_eagle_weight(self, name)
            rest.append((name, tensor))
        # returns None, as vLLM's own EAGLE drafters do: the embedding and LM head the
        # checkpoint lacks are the target's, shared after loading
        AutoWeightsLoader(self).load_weights(rest)

"""A model with a reduced vocabulary in vLLM's terms (``semspec.engine.reduced_vocab_plugin``
says when it runs). Imported by vLLM's model registry only, when an engine loads one.

vLLM runs a model's LM head over its whole vocabulary. For the layer draft that is most of a
pass (4 of the target's 30 layers are ~14M multiply-adds a token, its 49,152-row head ~28M,
the 8,192 rows it was trained on ~4.7M), and sampling from it proposes tokens the draft never
learnt to predict. Here the LM head runs over the reduced vocabulary's rows only and every other
token gets -inf, as in training and in transformers (``semspec.models.loaded``'s
``ReducedHead``).

The token ids are read from ``semspec_vocab.json`` beside the weights (vLLM's
``model_config.model``: semjobs hands vLLM the model's local directory), the file that is part
of the model's identity; nothing is copied into the config. Their rows of the loaded LM head
(the embedding, where tied) are gathered once, after loading, into an LM head of their own,
which vLLM's ``LogitsProcessor`` runs as it runs the full one: the config's logit scale and soft
cap, the head's number type, and on a CPU the packed matrix multiply vLLM prepares for every LM
head after loading. One mixin serves the families whose causal LM builds its LM head and logits
processor the same way: Llama, Qwen2, Qwen3.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from vllm.config import VllmConfig
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.model_executor.models.utils import maybe_prefix

from semspec.models.reduced_vocab import VOCAB_SUBSET_FILE, full_vocab_logits, read_vocab_subset


class ReducedVocabMixin:
    """Before a vLLM causal LM (``self.lm_head``, ``self.logits_processor``) in the bases: its
    logits over the reduced vocabulary's rows only. One device only (the plugin refuses tensor
    and pipeline parallelism: the head's rows are gathered whole)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        model_dir = Path(vllm_config.model_config.model)
        ids = read_vocab_subset(model_dir, device=None)
        vocab = int(self.config.vocab_size)
        if ids is None or int(ids[-1]) >= vocab:
            raise ValueError(f"{model_dir}: a reduced-vocabulary model needs {VOCAB_SUBSET_FILE} beside its weights, "
                             f"listing ids below its vocab_size {vocab}")
        if not isinstance(self.lm_head.quant_method, UnquantizedEmbeddingMethod):
            raise ValueError(f"{model_dir}: a reduced vocabulary needs an unquantized LM head")
        self.register_buffer("vocab_ids", ids, persistent=False)
        # unpadded: the logits processor's columns are exactly these tokens
        self.reduced_lm_head = ParallelLMHead(len(ids), int(self.config.hidden_size), padding_size=1,
                                              prefix=maybe_prefix(prefix, "reduced_lm_head"))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = super().load_weights(weights)
        # before vLLM's post-loading pass packs every LM head's weight for its CPU kernels
        self.reduced_lm_head.weight.data.copy_(self.lm_head.weight[self.vocab_ids])
        return loaded | {"reduced_lm_head.weight"}

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Logits over the whole vocabulary (what vLLM's sampler reads), -inf outside the
        reduced one."""
        reduced = self.logits_processor(self.reduced_lm_head, hidden_states)
        return full_vocab_logits(reduced, self.vocab_ids, self.logits_processor.org_vocab_size)


class SemspecReducedVocabLlamaForCausalLM(ReducedVocabMixin, LlamaForCausalLM):
    pass


class SemspecReducedVocabQwen2ForCausalLM(ReducedVocabMixin, Qwen2ForCausalLM):
    pass


class SemspecReducedVocabQwen3ForCausalLM(ReducedVocabMixin, Qwen3ForCausalLM):
    pass

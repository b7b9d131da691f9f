"""A transformers model in memory, for training, calibration and quality passes (workers
decode on vLLM): its forward pass with a KV cache, a reduced vocabulary's LM head, and the
model's identity."""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from semspec.models.dtypes import pick_device
from semspec.models.hf import from_pretrained
from semspec.models.identity import ModelIdentity
from semspec.models.reduced_vocab import ReducedHead, read_vocab_subset, reduced_head_logits
from semspec.models.specs import DEFAULT_TARGET, model_source


@functools.cache
def _cache_parameter(forward_owner: type) -> str:
    params = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_argument(model, cache) -> dict:
    """The keyword a transformers model's forward takes its KV cache by: ``cache`` since
    transformers 5.2x, ``past_key_values`` before (vLLM's CPU build pins transformers below
    5.20); an unknown keyword would be swallowed silently and the pass would run uncached."""
    return {_cache_parameter(type(model)): cache}


@dataclass
class LoadedModel:
    model: Any  # a transformers causal LM
    tokenizer: Any
    identity: ModelIdentity
    device: torch.device
    dtype: torch.dtype
    spec: str = ""
    # Token ids the model may predict (a draft with a reduced vocabulary, FR-Spec style):
    # its LM head then runs over these rows only, the rest of the vocabulary gets -inf.
    # None: the full vocabulary.
    vocab_ids: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, cache, want_hidden: bool, keep: int | torch.Tensor = 0):
        """One pass of ``input_ids`` [1, n] through the model with ``cache``: (logits
        [rows, V] float32 for the last ``keep`` positions -- all when 0, the given row indices
        when a tensor -- and the hidden states or None)."""
        logits, hidden = self._run(input_ids, cache, want_hidden, keep)
        return logits[0], hidden

    def next_token_logits(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        """A batched pass of ``input_ids`` [B, n] with ``cache``: float32 logits [B, V] after
        each row's last token (a reduced vocabulary as in ``forward``)."""
        return self._run(input_ids, cache, False, 1)[0][:, -1]

    def _run(self, input_ids, cache, want_hidden: bool, keep: int | torch.Tensor):
        if self.vocab_ids is None:
            out = self.model(input_ids=input_ids, **cache_argument(self.model, cache), use_cache=True,
                             output_hidden_states=want_hidden, logits_to_keep=keep)
            return out.logits.float(), out.hidden_states
        decoder = self.model.get_decoder()
        out = decoder(input_ids=input_ids, **cache_argument(decoder, cache), use_cache=True,
                      output_hidden_states=want_hidden)
        last = out.last_hidden_state
        if isinstance(keep, torch.Tensor):
            last = last[:, keep]
        elif keep:
            last = last[:, -keep:]
        return self.head_logits(last), out.hidden_states

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits over the whole vocabulary from final-norm states, through the LM
        head (the reduced vocabulary's rows only, when the model has one)."""
        if self.vocab_ids is None:
            return self.model.get_output_embeddings()(hidden).float()
        return reduced_head_logits(hidden, self._reduced_rows(), self.vocab_ids, self.vocab_size).float()

    @contextmanager
    def reduced_head(self):
        """The transformers model with its LM head swapped, for this block, for one over the
        reduced vocabulary only -- for callers that run the model themselves (transformers'
        assisted generation); a no-op for a full-vocabulary model."""
        if self.vocab_ids is None:
            yield self.model
            return
        full = self.model.get_output_embeddings()
        self.model.set_output_embeddings(ReducedHead(self._reduced_rows(), self.vocab_ids, self.vocab_size))
        try:
            yield self.model
        finally:
            self.model.set_output_embeddings(full)

    def _reduced_rows(self) -> torch.nn.Linear:
        """A linear layer over the LM head's rows of the reduced vocabulary (made once)."""
        head = getattr(self, "_reduced_rows_cache", None)
        if head is None:
            rows = self.model.get_output_embeddings().weight[self.vocab_ids].detach().contiguous()
            head = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")
            head.weight = torch.nn.Parameter(rows, requires_grad=False)
            self._reduced_rows_cache = head
        return head

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def weights_per_pass(self) -> int:
        """Parameters one decoding pass reads: all but the input embedding (a token reads
        one row of it), with the LM head's rows of the reduced vocabulary only -- also for a
        draft head, whose LM head is the target's, held outside its own modules."""
        params = {id(p): p for p in self.model.parameters()}
        n = sum(p.numel() for p in params.values())
        embed = self.model.get_decoder().embed_tokens.weight
        head = self.model.get_output_embeddings().weight
        if id(embed) in params:
            n -= embed.numel()
        if id(head) in params and head is not embed:
            n -= head.numel()
        rows = len(self.vocab_ids) if self.vocab_ids is not None else head.shape[0]
        return int(n + rows * head.shape[1])

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def max_context(self) -> int | None:
        n = getattr(self.model.config, "max_position_embeddings", None)
        return int(n) if n else None

    @property
    def eos_token_ids(self) -> set[int]:
        return eos_token_ids(self.model.config, getattr(self.model, "generation_config", None), self.tokenizer)


def eos_token_ids(model_config, generation_config, tokenizer) -> set[int]:
    """Every token id that ends a generation: the generation config's, the model config's
    and the tokenizer's end-of-sequence ids."""
    ids: set[int] = set()
    for src in (generation_config, model_config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def load_model(
    spec: str | os.PathLike | None = None,
    device: str | torch.device = "auto",
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype | None = None,
) -> LoadedModel:
    """Load a causal LM + tokenizer from a spec (``semspec.models.specs``), ready for inference."""
    load_dir, identity = model_source(spec, cache_dir)
    dev, default_dtype = pick_device(device)
    dtype = dtype or default_dtype
    model, tokenizer = from_pretrained(load_dir, dtype)
    model.to(dev)
    model.eval()
    name = str(spec) if spec is not None else DEFAULT_TARGET
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        identity=identity,
        device=dev,
        dtype=dtype,
        spec=name,
        vocab_ids=read_vocab_subset(Path(load_dir), dev),
    )


def truncated_copy(loaded: LoadedModel, num_layers: int, identity_suffix: str | None = None) -> LoadedModel:
    """A cheap model made of the first ``num_layers`` layers of ``loaded`` (same tokenizer,
    embedding, final norm and LM head). Useful as a test draft; the weights are copies."""
    cfg = copy.deepcopy(loaded.model.config)
    if num_layers < 1 or num_layers > cfg.num_hidden_layers:
        raise ValueError(f"num_layers must be in 1..{cfg.num_hidden_layers}")
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    model = type(loaded.model)(cfg)
    state = {
        k: v
        for k, v in loaded.model.state_dict().items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers
    }
    model.load_state_dict(state, strict=False)
    model.to(device=loaded.device, dtype=loaded.dtype)
    model.eval()
    suffix = identity_suffix or f"first{num_layers}layers"
    sha = hashlib.sha256(f"{loaded.identity.sha256}#{suffix}".encode()).hexdigest()
    return LoadedModel(
        model=model,
        tokenizer=loaded.tokenizer,
        identity=ModelIdentity(f"{loaded.identity.name}#{suffix}", sha),
        device=loaded.device,
        dtype=loaded.dtype,
        spec=f"{loaded.spec}#{suffix}",
    )

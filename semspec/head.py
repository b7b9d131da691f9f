"""An EAGLE-style draft head: a small decoder that drafts from the target's own states.

At position j the head reads the target's final-norm state at j-1 (what the target's LM head
read to predict token j) fused with the embedding of token j, runs its decoder layer(s) --
with a KV cache of its own over the sequence -- and a final norm, and predicts the target's
state at j; the target's LM head (the rows of a reduced vocabulary) turns that into the next
token's logits. Drafting several tokens, it reads its own predicted states where the target's
are not known yet. Position 0 reads a zero state.

The head is trained here (``HeadModel.unrolled_forward``, ``semspec.draft.head_train``) and
drafts in vLLM, exported to its EAGLE method (``semspec.engine.head_plugin``). It is loaded as a
:class:`semspec.models.loaded.LoadedModel` whose model is a :class:`HeadModel`: it shares the
target's embedding, rotary embedding, LM head and tokenizer (``get_decoder()`` with
``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``, plus ``fuse_inputs``).

Artifact (no pickles): ``head.safetensors`` (``fc.weight``, ``fc.bias``, ``layers.<i>.<param>``,
``norm.weight``, ``vocab_ids``) and ``head.json`` (format tag, layer count, the target's
signature and weight checksums, training summary). ``load_head`` refuses an artifact built for
another target.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .models.draft_artifact import check_fingerprint, files_sha256, read_artifact, target_checksums, target_signature
from .models.identity import ModelIdentity, derived_sha256
from .models.loaded import LoadedModel
from .models.specs import EMBEDDED_PREFIX


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def project_qkv(layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv: int,
                head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decoder layer's rotated queries and keys, and its values, for packed rows ``x`` [T, H]
    (``cos``/``sin`` [T, 1, d]): [T, heads, d] each (the head's training forward)."""
    attn = layer.self_attn
    h = layer.input_layernorm(x)
    n_tok = h.shape[0]
    q = attn.q_proj(h).view(n_tok, n_heads, head_dim)
    k = attn.k_proj(h).view(n_tok, n_kv, head_dim)
    v = attn.v_proj(h).view(n_tok, n_kv, head_dim)
    if getattr(attn, "q_norm", None) is not None:  # Qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


HEAD_FORMAT = "semspec-head/1"
HEAD_WEIGHTS = "head.safetensors"
HEAD_META = "head.json"
EMBEDDED_HEAD_DIR = Path(__file__).resolve().parent / "assets" / "head"
EMBEDDED_HEADS = {"smollm2-135m-head": EMBEDDED_HEAD_DIR}


class HeadMismatchError(ValueError):
    """The head was trained for another target."""


class HeadModel(nn.Module):
    """The head's trainable part (``fc``, ``layers``, ``norm``) around the target's shared
    embedding, rotary embedding and LM head (held by reference, not copied, not trained)."""

    def __init__(self, target_model, layers: int = 1, init_from_target: bool = True):
        super().__init__()
        tdec = target_model.get_decoder()
        cfg = copy.deepcopy(target_model.config)
        n_t = int(cfg.num_hidden_layers)
        if not 1 <= layers <= n_t:
            raise ValueError(f"a head has 1..{n_t} layers")
        cfg.num_hidden_layers = layers
        if isinstance(getattr(cfg, "layer_types", None), list):
            cfg.layer_types = cfg.layer_types[n_t - layers:]
        self.config = cfg
        h = int(cfg.hidden_size)
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.layers = nn.ModuleList()
        for i in range(layers):
            layer = type(tdec.layers[0])(cfg, i)
            if init_from_target:  # the target's last layers already map into its LM head's space
                layer.load_state_dict(tdec.layers[n_t - layers + i].state_dict())
            self.layers.append(layer)
        self.norm = copy.deepcopy(tdec.norm)
        with torch.no_grad():  # start as "the target's state passes through": fc = [I, 0]
            self.fc.weight.zero_()
            self.fc.weight[:, :h].copy_(torch.eye(h))
            self.fc.bias.zero_()
        self._shared = {"embed": tdec.embed_tokens, "rotary": tdec.rotary_emb,
                        "head": target_model.get_output_embeddings()}
        self.generation_config = copy.deepcopy(getattr(target_model, "generation_config", None))

    def forward(self, *args, **kwargs):
        raise TypeError("a draft head reads the target's states, which a plain forward call does not "
                        "have: train it with unrolled_forward, draft with it in vLLM (semspec.engine.head_plugin)")

    # the parts of a decoder the training forward and the vLLM export read
    @property
    def embed_tokens(self):
        return self._shared["embed"]

    @property
    def rotary_emb(self):
        return self._shared["rotary"]

    def get_decoder(self):
        return self

    def get_output_embeddings(self):
        return self._shared["head"]

    def fuse_inputs(self, states: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """The head's input rows: the target's (or its own predicted) states fused with the
        next tokens' embeddings."""
        return self.fc(torch.cat([states.to(embeds.dtype), embeds], dim=-1))

    def unrolled_forward(self, states_in: torch.Tensor, ids: torch.Tensor, levels: int = 1) -> list[torch.Tensor]:
        """Teacher-forced passes over whole sequences, unrolled on the head's own predictions as
        it drafts (EAGLE-3's training-time test). ``states_in`` [B, L, H] is the target state
        read at each position, ``ids`` [B, L]; returns ``levels`` tensors of predicted states
        [B, L, H] (after the norm). Level 1 reads the target's states. Level m at position j is
        the head's m-th drafted token when it last read a target state at j - m + 1: it reads
        level m-1's prediction at j - 1, and attends to level 1's keys up to j - m + 1 and to
        level m''s key at j - m + m' for m' = 2..m -- the cache a draft of depth m holds."""
        bsz, length = ids.shape
        n_h, n_kv = int(self.config.num_attention_heads), int(self.config.num_key_value_heads)
        d = int(self.layers[0].self_attn.head_dim)
        emb = self.embed_tokens(ids)
        pos = torch.arange(length, device=ids.device)
        cos, sin = self.rotary_emb(emb, pos.expand(bsz, -1))
        cos, sin = cos.reshape(bsz * length, 1, d), sin.reshape(bsz * length, 1, d)
        keys: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.layers]
        preds: list[torch.Tensor] = []
        read = states_in
        for m in range(1, levels + 1):
            # which keys a query at j may read: level 1 up to j - m + 1, then one per later level
            allowed = [pos[None, :] <= pos[:, None] - m + 1]
            allowed += [pos[None, :] == pos[:, None] - m + k for k in range(2, m + 1)]
            mask = torch.cat(allowed, dim=1)[None, None]  # [1, 1, L, m * L]
            x = self.fuse_inputs(read, emb).reshape(bsz * length, -1)
            for li, layer in enumerate(self.layers):
                q, k, v = project_qkv(layer, x, cos, sin, n_h, n_kv, d)
                keys[li].append((k.view(bsz, length, n_kv, d).transpose(1, 2), v.view(bsz, length, n_kv, d).transpose(1, 2)))
                att = F.scaled_dot_product_attention(
                    q.view(bsz, length, n_h, d).transpose(1, 2), torch.cat([kk for kk, _ in keys[li]], dim=2),
                    torch.cat([vv for _, vv in keys[li]], dim=2), attn_mask=mask,
                    scale=float(layer.self_attn.scaling), enable_gqa=n_h != n_kv)
                x = x + layer.self_attn.o_proj(att.transpose(1, 2).reshape(bsz * length, n_h * d))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            preds.append(self.norm(x).view(bsz, length, -1))
            # the next level reads this one's prediction one position on
            read = torch.cat([torch.zeros_like(preds[-1][:, :1]), preds[-1][:, :-1]], dim=1)
        return preds

    def trained_state(self) -> dict[str, torch.Tensor]:
        """What the artifact stores: everything but the shared parts."""
        return {k: v.detach().clone() for k, v in self.state_dict().items()}


def target_fingerprint(target_model) -> dict:
    """The target a head was trained for: its architecture and weight checksums of every layer."""
    return {"signature": target_signature(target_model),
            "checksums": target_checksums(target_model, int(target_model.config.num_hidden_layers))}


def save_head(head: HeadModel, vocab_ids: torch.Tensor | None, meta: dict, out_dir: str | os.PathLike) -> Path:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to("cpu", torch.float16).contiguous() for k, v in sorted(head.trained_state().items())}
    if vocab_ids is not None:
        tensors["vocab_ids"] = vocab_ids.to("cpu", torch.long).contiguous()
    meta = {**meta, "format": HEAD_FORMAT, "layers": len(head.layers), "weights_dtype": "float16"}
    save_file(tensors, str(out / HEAD_WEIGHTS), metadata={"format": HEAD_FORMAT})
    (out / HEAD_META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def resolve_head(spec: str | os.PathLike | None) -> Path | None:
    """The artifact directory a draft spec names, when it names a head: an embedded head
    (``embedded:smollm2-135m-head``) or a directory holding ``head.json``."""
    if spec is None:
        return None
    spec = str(spec)
    if spec.startswith(EMBEDDED_PREFIX):
        return EMBEDDED_HEADS.get(spec[len(EMBEDDED_PREFIX):])
    p = Path(spec).expanduser()
    return p if (p / HEAD_META).is_file() else None


def head_sha256(artifact_dir: str | os.PathLike, target_sha256: str) -> str:
    """A head's identity: its artifact's files on its target."""
    return derived_sha256("semspec-head", files_sha256(artifact_dir, (HEAD_META, HEAD_WEIGHTS)), target_sha256)


def load_head(artifact_dir: str | os.PathLike, target: LoadedModel, spec: str | None = None) -> LoadedModel:
    """The head in ``artifact_dir`` on ``target`` (checked against it), as a loaded draft."""
    d = Path(artifact_dir)
    meta, tensors, weights_path = read_artifact(d, HEAD_META, HEAD_WEIGHTS, HEAD_FORMAT, HeadMismatchError,
                                                "draft head")
    check_fingerprint(meta["target"], target.model, int(target.model.config.num_hidden_layers), HeadMismatchError,
                      "the draft head")
    vocab = tensors.pop("vocab_ids", None)
    head = HeadModel(target.model, layers=int(meta["layers"]), init_from_target=False)
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise HeadMismatchError(f"{weights_path}: missing {missing}, unexpected {unexpected}")
    head.to(device=target.device, dtype=target.dtype).eval()
    return LoadedModel(
        model=head, tokenizer=target.tokenizer,
        identity=ModelIdentity(str(spec or d), head_sha256(d, target.identity.sha256)),
        device=target.device, dtype=target.dtype, spec=str(spec or d),
        vocab_ids=vocab.to(target.device) if vocab is not None else None,
    )


def load_draft(spec: str, target: LoadedModel, **load_kwargs) -> LoadedModel:
    """A draft by spec: a draft head onto ``target``, or any other model through
    ``semspec.models.loaded.load_model(spec, **load_kwargs)``."""
    head_dir = resolve_head(spec)
    if head_dir is not None:
        return load_head(head_dir, target, spec=spec)
    from .models.loaded import load_model

    return load_model(spec, **load_kwargs)


def is_head(model: LoadedModel | None) -> bool:
    return model is not None and isinstance(model.model, HeadModel)

"""The draft artifact (trained weights + JSON metadata) and its materialisation.

Artifact directory layout (no pickles anywhere):
- ``draft.safetensors``: the adapter layers as ``layers.<j>.<param>``, ``norm.weight`` and,
  for a draft with a reduced vocabulary, the token ids it predicts as ``vocab_ids``.
- ``draft.json``: format tag, architecture (frozen/adapter layer counts, hidden size, vocab),
  the target it was trained against (name, shapes, weight checksums) and a training summary.

A draft *model* is the target's embedding, first ``frozen_layers`` layers and LM head plus the
artifact's adapter layers and norm. ``materialize_draft`` writes it as an ordinary Hugging Face
model directory, so it loads like any other model.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from semspec.models.paths import DRAFT_ARTIFACT_META
from semspec.models.reduced_vocab import VOCAB_SUBSET_FILE

FORMAT = "semspec-draft/1"
WEIGHTS_FILE = "draft.safetensors"
META_FILE = DRAFT_ARTIFACT_META
VOCAB_TENSOR = "vocab_ids"


class DraftMismatchError(ValueError):
    """The artifact was built for a different target (shape or weights)."""


@dataclass
class DraftArtifact:
    meta: dict
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def frozen_layers(self) -> int:
        return int(self.meta["frozen_layers"])

    @property
    def adapter_layers(self) -> int:
        return int(self.meta["adapter_layers"])

    @property
    def num_layers(self) -> int:
        return self.frozen_layers + self.adapter_layers

    @property
    def vocab_ids(self) -> torch.Tensor | None:
        """The token ids a reduced-vocabulary draft predicts (None: all)."""
        return self.tensors.get(VOCAB_TENSOR)


def _decoder(model):
    """The decoder stack of a causal LM (``model.model`` for Llama-style models)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise TypeError(f"unsupported model class for a layer-sharing draft: {type(model).__name__}")
    return inner


def target_checksums(target, frozen_layers: int) -> dict[str, float]:
    """Cheap fingerprints of the shared weights: sum of |w| of the embedding and of each
    shared layer's query projection. Tolerant to dtype casts, not to different weights."""
    dec = _decoder(target)
    sums = {"embed": float(dec.embed_tokens.weight.detach().float().abs().sum())}
    for i in range(frozen_layers):
        w = dec.layers[i].self_attn.q_proj.weight
        sums[f"layer{i}.q_proj"] = float(w.detach().float().abs().sum())
    return sums


def target_signature(target) -> dict:
    return config_signature(target.config)


def config_signature(cfg) -> dict:
    """The architecture a transformers config describes, as artifacts record their target's."""
    return {
        "model_type": cfg.model_type,
        "hidden_size": int(cfg.hidden_size),
        "num_hidden_layers": int(cfg.num_hidden_layers),
        "vocab_size": int(cfg.vocab_size),
        "num_attention_heads": int(cfg.num_attention_heads),
        "num_key_value_heads": int(getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)),
        "intermediate_size": int(cfg.intermediate_size),
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
    }


def signature_diff(recorded: dict, have: dict) -> dict:
    """key -> (recorded, here) for each way the architecture ``have`` differs from the one an
    artifact recorded (``config_signature``)."""
    return {k: (recorded.get(k), v) for k, v in have.items() if recorded.get(k) != v}


def check_fingerprint(recorded: dict, target, layers: int, error: type[Exception], what: str,
                      rtol: float = 1e-2) -> None:
    """Raise ``error`` unless ``target`` has the architecture (``recorded["signature"]``) and
    the weight checksums of its first ``layers`` layers (``recorded["checksums"]``) that an
    artifact (``what``, for the message) recorded when it was trained."""
    have = target_signature(target)
    diff = signature_diff(recorded["signature"], have)
    if diff:
        raise error(f"{what} was built for another target architecture: {diff}")
    if layers > have["num_hidden_layers"]:
        raise error(f"{what} needs more layers than the target has")
    have_sums = target_checksums(target, layers)
    for key, ref in recorded.get("checksums", {}).items():
        got = have_sums.get(key)
        if got is None or abs(got - ref) > rtol * max(abs(ref), 1e-6):
            raise error(f"{what} was trained against different target weights ({key}: {got} vs {ref})")


def check_compatible(target, artifact: DraftArtifact, rtol: float = 1e-2) -> None:
    """Raise DraftMismatchError when ``artifact`` was not trained for ``target``."""
    if artifact.meta.get("format") != FORMAT:
        raise DraftMismatchError(f"not a {FORMAT} artifact: format={artifact.meta.get('format')!r}")
    check_fingerprint(artifact.meta["target"], target, artifact.frozen_layers, DraftMismatchError,
                      "draft artifact", rtol)


def files_sha256(directory: str | os.PathLike, names) -> str:
    """One digest over an artifact's files (name and content of each, in the order given)."""
    import hashlib

    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + b"\0" + hashlib.sha256((Path(directory) / name).read_bytes()).digest())
    return h.hexdigest()


def save_artifact(artifact: DraftArtifact, out_dir: str | os.PathLike, dtype=torch.float16) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
               for k, v in sorted(artifact.tensors.items())}
    meta = dict(artifact.meta)
    meta["format"] = FORMAT
    meta["weights_dtype"] = str(dtype).replace("torch.", "")
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": FORMAT})
    (out / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def read_artifact(directory: str | os.PathLike, meta_file: str, weights_file: str, fmt: str, error: type,
                  what: str) -> tuple[dict, dict[str, torch.Tensor], Path]:
    """(metadata, tensors, weights path) of an artifact directory (a layer draft's, a draft
    head's): ``error`` when its metadata names another format."""
    d = Path(directory)
    meta_path, weights_path = d / meta_file, d / weights_file
    if not meta_path.is_file() or not weights_path.is_file():
        raise FileNotFoundError(f"no {what} in {d} (need {meta_file} and {weights_file})")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != fmt:
        raise error(f"{meta_path}: not a {fmt} artifact")
    return meta, load_file(str(weights_path)), weights_path


def load_artifact(path: str | os.PathLike) -> DraftArtifact:
    meta, tensors, weights_path = read_artifact(path, META_FILE, WEIGHTS_FILE, FORMAT, DraftMismatchError,
                                                "draft artifact")
    art = DraftArtifact(meta=meta, tensors=tensors)
    expected = {f"layers.{j}." for j in range(art.adapter_layers)}
    found = {k.split(".")[0] + "." + k.split(".")[1] + "." for k in tensors if k.startswith("layers.")}
    if found != expected or "norm.weight" not in tensors:
        raise DraftMismatchError(f"{weights_path}: tensors do not match {META_FILE}")
    return art


def draft_config(target_config, artifact: DraftArtifact):
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = artifact.num_layers
    layer_types = getattr(cfg, "layer_types", None)
    if isinstance(layer_types, list) and layer_types:
        frozen = layer_types[: artifact.frozen_layers]
        init = artifact.meta.get("adapter_init") or []
        cfg.layer_types = frozen + [layer_types[i] for i in init]
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(cfg, attr):
            try:
                delattr(cfg, attr)
            except AttributeError:
                pass
    return cfg


def build_draft_model(target, artifact: DraftArtifact, check: bool = True):
    """An in-memory draft model (same class as ``target``) sharing nothing mutable with it:
    the shared weights are copied, so the draft can live on its own."""
    if check:
        check_compatible(target, artifact)
    cfg = draft_config(target.config, artifact)
    ref = next(target.parameters())
    draft = type(target)(cfg).to(ref.device, ref.dtype)
    dec, tdec = _decoder(draft), _decoder(target)
    k = artifact.frozen_layers
    state = {}
    for name, t in tdec.embed_tokens.state_dict().items():
        state[f"embed_tokens.{name}"] = t
    for i in range(k):
        for name, t in tdec.layers[i].state_dict().items():
            state[f"layers.{i}.{name}"] = t
    for key, t in artifact.tensors.items():
        if key == VOCAB_TENSOR:
            continue
        if key.startswith("layers."):
            _, j, rest = key.split(".", 2)
            state[f"layers.{k + int(j)}.{rest}"] = t
        else:
            state[key] = t
    state = {n: t.to(ref.device, ref.dtype) for n, t in state.items()}
    missing, unexpected = dec.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise DraftMismatchError(f"draft weights incomplete: missing={missing} unexpected={unexpected}")
    if getattr(cfg, "tie_word_embeddings", False):
        draft.tie_weights()
    else:
        draft.lm_head.weight.data.copy_(target.lm_head.weight.data)
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()


def materialize_draft(target, tokenizer, artifact_dir, out_dir, check: bool = True) -> Path:
    """Write the draft as an ordinary Hugging Face model directory (atomically)."""
    art = load_artifact(artifact_dir)
    draft = build_draft_model(target, art, check=check).float()
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        draft.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        shutil.copy(Path(artifact_dir) / META_FILE, tmp / "semspec_draft.json")
        if art.vocab_ids is not None:
            (tmp / VOCAB_SUBSET_FILE).write_text(json.dumps({"token_ids": art.vocab_ids.tolist()}))
        if (out / "semspec_draft.json").is_file():
            shutil.rmtree(tmp)  # another process finished first: same inputs, same result
        else:
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out

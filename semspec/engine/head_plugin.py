"""The draft head (``semspec.head``) as a vLLM EAGLE drafter, so ``token_sd`` on vLLM runs on
vLLM's own speculative decoding with the head as it was trained (``semspec.draft.head_train``).

vLLM's built-in EAGLE layouts cannot hold this head as it was trained: its EAGLE-1 Llama
drafter has no bias on ``fc``, skips the layer's input norm and applies no final norm, and its
EAGLE-3 drafter norms the token embedding and the state apart before a wider first layer.
Retraining the head in one of those layouts would cost the hour it took to train; instead
the head's own architecture is registered with vLLM's model registry (the documented way to
add a model out of tree) as ``EagleSemspecHeadForCausalLM``, which vLLM's ``eagle`` method
drives like any EAGLE drafter: it reads the target's final-norm states, which is what the
head was trained on.

One difference remains, from how vLLM feeds an EAGLE drafter: it pairs the target's state at
position i with the token at i + 1 starting at i = 0, so the head never sees the pair its
training starts with (a zero state with the first prompt token). Rotary positions are one
lower than in training for every pair, which attention, reading only relative positions,
does not see.

The head's decoder layers are the target family's own in vLLM, as in training (where they are
transformers' layers of the target's class): ``HEAD_MODEL_TYPES`` names the families
(transformers' ``model_type``) whose layers ``semspec.engine.head_model`` runs -- Llama's, Qwen2's
(biases on q/k/v) and Qwen3's (q/k norms) -- and heads trained on other targets are refused
before an engine starts (``semspec.engine.speculation``).

``export_head`` writes the checkpoint (``config.json`` + ``model.safetensors``) vLLM loads;
``register`` puts the architecture in this process's registry (``semspec.engine.token_engine`` calls
it before starting an engine; the ``vllm.general_plugins`` entry point does it in engine
processes vLLM starts itself).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

# vLLM's eagle method keeps an architecture that starts with "Eagle" as it is
ARCHITECTURE = "EagleSemspecHeadForCausalLM"
# the target families (transformers' model_type) whose decoder layers the head runs in vLLM:
# names only, so that checking a head needs no vLLM (head_model maps each to its layer)
HEAD_MODEL_TYPES = ("llama", "qwen2", "qwen3")
EXPORT_FORMAT = "semspec-head-vllm/2"  # /2: no quantization_config of the target's


def export_head(head_dir: str | os.PathLike, target_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write the head of ``head_dir`` (a ``semspec.head`` artifact) on the target whose
    transformers directory is ``target_dir`` as a checkpoint vLLM's ``eagle`` method loads.
    Idempotent: an existing export is kept (its directory name carries the head's identity)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    from semspec.models.draft_artifact import config_signature, signature_diff
    from semspec.head import HEAD_META, HEAD_WEIGHTS, HeadMismatchError

    out = Path(out_dir)
    if (out / "model.safetensors").is_file() and _export_format(out) == EXPORT_FORMAT:
        return out
    meta = json.loads((Path(head_dir) / HEAD_META).read_text())
    # the architecture only: load_head also checks the target's weights, which vLLM loads
    # where this cannot see them
    diff = signature_diff(meta["target"]["signature"],
                          config_signature(AutoConfig.from_pretrained(target_dir, local_files_only=True)))
    if diff:
        raise HeadMismatchError(f"the draft head in {head_dir} was built for another target architecture: {diff}")
    config = json.loads((Path(target_dir) / "config.json").read_text())
    tensors = load_file(str(Path(head_dir) / HEAD_WEIGHTS))
    hidden = int(config["hidden_size"])
    # vLLM concatenates (token embedding, state); the head was trained on (state, embedding)
    fc = tensors["fc.weight"]
    tensors["fc.weight"] = torch.cat([fc[:, hidden:], fc[:, :hidden]], dim=1).contiguous()
    layers = int(meta["layers"])
    # the target's config otherwise as it is: its model_type picks the family's decoder layer
    # (head_model), which reads its shapes, rope, q/k/v biases and head_dim from it as the
    # target's own layers do
    config.update(architectures=[ARCHITECTURE], num_hidden_layers=layers, semspec_format=EXPORT_FORMAT)
    # but for its quantization: the head's weights are float, whatever the target's are
    config.pop("quantization_config", None)
    config.pop("compression_config", None)
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][-layers:]
    # written aside and moved in whole: engine processes starting together each write their
    # own, the first to move in wins and the others keep it
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if out.exists() and _export_format(out) != EXPORT_FORMAT:  # an older format's export: replaced
        shutil.rmtree(out, ignore_errors=True)
    try:
        os.rename(tmp, out)
    except OSError:
        if _export_format(out) != EXPORT_FORMAT:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _export_format(out: Path) -> str | None:
    """The format an export directory was written in (None: none there, or unreadable)."""
    try:
        return json.loads((out / "config.json").read_text()).get("semspec_format")
    except (OSError, ValueError):
        return None


def register() -> None:
    """Make the head's architecture, and those of models with a reduced vocabulary
    (``semspec.engine.reduced_vocab_plugin``), known to vLLM in this process (idempotent)."""
    from vllm import ModelRegistry

    from semspec.engine.reduced_vocab_plugin import MODEL_CLASSES

    known = set(ModelRegistry.get_supported_archs())
    for architecture, model_class in {ARCHITECTURE: "semspec.engine.head_model:EagleSemspecHeadForCausalLM",
                                      **MODEL_CLASSES}.items():
        if architecture not in known:
            ModelRegistry.register_model(architecture, model_class)

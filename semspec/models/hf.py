"""Reading a model directory (or a GGUF file) with transformers: local files only, and
safetensors only (unpickling a checkpoint can run code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from semspec.models.paths import ModelLoadError


def from_pretrained(path: Path, dtype: torch.dtype, gguf_file: str | None = None):
    """(transformers causal LM, tokenizer) from ``path``; a GGUF file in it de-quantized."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf_file is not None:
        from transformers.utils.quantization_config import GgufConfig

        kwargs["gguf_file"] = gguf_file
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, quantization_config=GgufConfig(gguf_file=gguf_file, dequantize=True), **kwargs
        )
    else:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        if not any(path.glob("*.safetensors")):
            raise ModelLoadError(f"{path}: no .safetensors weights; pickled checkpoints are not loaded "
                                 "(save the model with save_pretrained(safe_serialization=True))")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True, **kwargs)
    return model, tokenizer


def library_tag() -> str:
    """The transformers release that writes converted and materialised model directories:
    part of their cache names, so that a release never reads a directory another wrote (the
    models' identities do not depend on it)."""
    import transformers

    return f"tf{transformers.__version__}"

"""GGUF files de-quantized once into the model cache as plain Hugging Face directories,
written atomically (temporary directory, then rename) so that concurrent workers never see a
half-written copy."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from semspec.models.hf import from_pretrained, library_tag
from semspec.models.paths import ResolvedSpec

SOURCE_FILE = "semjobs_source.json"  # in a converted copy: the GGUF it came from


def loadable_directory(resolved: ResolvedSpec, sha: str, cache_root: Path) -> Path:
    """The directory transformers and vLLM load for ``resolved``: itself, or for a GGUF its
    converted copy (made on first use)."""
    return convert_to_cache(resolved, sha, cache_root) if resolved.kind == "gguf" else resolved.path


def convert_to_cache(resolved: ResolvedSpec, sha: str, cache_root: Path) -> Path:
    """De-quantize a GGUF once into ``cache_root/<name>-<sha[:16]>-<library tag>``."""
    final = cache_root / f"{resolved.name}-{sha[:16]}-{library_tag()}"
    if (final / SOURCE_FILE).exists():
        return final
    cache_root.mkdir(parents=True, exist_ok=True)
    model, tokenizer = from_pretrained(resolved.path.parent, torch.float32, gguf_file=resolved.path.name)
    _strip_quantization(model)
    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=f".{final.name}.tmp-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(
            json.dumps({"source": str(resolved.path), "sha256": sha, "converted_at": time.time()}, indent=1)
        )
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / SOURCE_FILE).exists():
                raise
            # another worker finished first: its copy is identical
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def converted_copy(resolved: ResolvedSpec, cache_root: Path) -> Path | None:
    """A GGUF's converted copy if one exists, found by its source path (hashing a big file to
    name it takes minutes)."""
    for directory in cache_root.glob(f"{resolved.name}-*"):
        if _converted_from(directory) == str(resolved.path):
            return directory
    return None


def _converted_from(directory: Path) -> str | None:
    try:
        return json.loads((directory / SOURCE_FILE).read_text())["source"]
    except (OSError, ValueError, KeyError):
        return None


def _strip_quantization(model) -> None:
    """Make a de-quantized GGUF model look like a plain float checkpoint, so it can be saved."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        try:
            delattr(model.config, "quantization_config")
        except AttributeError:
            setattr(model.config, "quantization_config", None)
    model.is_quantized = False

"""The embedded draft ``"embedded:smollm2-135m-draft"``: the committed artifact in
``semspec/assets/draft`` applied to the embedded target, materialised once into the model
cache as an ordinary Hugging Face directory (``semspec.models.specs`` resolves the name)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from semspec.models.draft_artifact import META_FILE, WEIGHTS_FILE, files_sha256, materialize_draft
from semspec.models.hf import from_pretrained, library_tag
from semspec.models.identity import derived_sha256

ARTIFACT_DIR = Path(__file__).resolve().parent.parent / "assets" / "draft"
NAME = "smollm2-135m-draft"


def artifact_sha256(artifact_dir: str | os.PathLike = ARTIFACT_DIR) -> str:
    return files_sha256(artifact_dir, (META_FILE, WEIGHTS_FILE))


def draft_sha256(target_sha256: str, artifact_dir: str | os.PathLike = ARTIFACT_DIR) -> str:
    """The draft's identity: its committed artifact on its target (never the materialised
    directory, whose config.json transformers writes)."""
    return derived_sha256("semspec-draft", artifact_sha256(artifact_dir), target_sha256)


def materialized_draft_dir(cache_root: str | os.PathLike, target_dir: Callable[[], Path],
                           artifact_dir: str | os.PathLike = ARTIFACT_DIR) -> Path:
    """The draft's model directory in ``cache_root``, built on first use (atomically) from
    the target's model directory, which ``target_dir()`` gives (asked only then: it may
    convert the target's GGUF)."""
    final = Path(cache_root) / f"{NAME}-{artifact_sha256(artifact_dir)[:16]}-{library_tag()}"
    if (final / "semspec_draft.json").is_file():
        return final
    target, tokenizer = from_pretrained(target_dir(), torch.float32)
    materialize_draft(target, tokenizer, artifact_dir, final)
    return final

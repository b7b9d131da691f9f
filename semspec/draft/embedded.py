"""The embedded draft ``"embedded:smollm2-135m-draft"``: the committed artifact in
``semspec/assets/draft`` applied to the embedded target, materialised once into the model
cache as an ordinary Hugging Face directory."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from semspec.draft.artifact import META_FILE, WEIGHTS_FILE, files_sha256, materialize_draft
from semspec.models import derived_sha256, library_tag

ARTIFACT_DIR = Path(__file__).resolve().parent.parent / "assets" / "draft"
TARGET_SPEC = "embedded:smollm2-135m"
NAME = "smollm2-135m-draft"


def artifact_sha256(artifact_dir: str | os.PathLike = ARTIFACT_DIR) -> str:
    return files_sha256(artifact_dir, (META_FILE, WEIGHTS_FILE))


def draft_sha256(target_sha256: str, artifact_dir: str | os.PathLike = ARTIFACT_DIR) -> str:
    """The draft's identity: its committed artifact on its target (never the materialised
    directory, whose config.json transformers writes)."""
    return derived_sha256("semspec-draft", artifact_sha256(artifact_dir), target_sha256)


def materialized_draft_dir(cache_root: str | os.PathLike, artifact_dir: str | os.PathLike = ARTIFACT_DIR,
                           target_spec: str = TARGET_SPEC) -> Path:
    """The draft's model directory in ``cache_root``, built on first use (atomically)."""
    from semspec.models import load_model

    final = Path(cache_root) / f"{NAME}-{artifact_sha256(artifact_dir)[:16]}-{library_tag()}"
    if (final / "semspec_draft.json").is_file():
        return final
    target = load_model(target_spec, device="cpu", cache_dir=cache_root, dtype=torch.float32)
    materialize_draft(target.model, target.tokenizer, artifact_dir, final)
    return final

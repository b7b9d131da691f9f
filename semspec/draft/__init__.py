"""A cheap draft model for a target: the target's first k layers plus trained adapter layers.

Self-speculation in the Kangaroo / LayerSkip manner: the draft shares the target's embedding,
its first ``frozen_layers`` decoder layers and its (tied) LM head; on top sit
``adapter_layers`` decoder layers (initialised from target layers) and a final norm, trained
to match the target's next-token distribution. Only the adapter layers and the norm are
stored (the artifact); a full Hugging Face model directory is materialised from the target's
weights plus the artifact, so the engine loads the draft like any other model.
"""

from semspec.draft.config import DraftTrainConfig

_LAZY = {
    "DraftArtifact": "semspec.draft.artifact",
    "build_draft_model": "semspec.draft.artifact",
    "load_artifact": "semspec.draft.artifact",
    "materialize_draft": "semspec.draft.artifact",
    "save_artifact": "semspec.draft.artifact",
    "train_draft": "semspec.draft.train",
}


def __getattr__(name):  # torch is imported on first use, not by `semjobs --help`
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = ["DraftTrainConfig", *_LAZY]

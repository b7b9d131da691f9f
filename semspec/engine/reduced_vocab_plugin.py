"""A model with a reduced vocabulary (``semspec.models.reduced_vocab``: a ``semspec_vocab.json``
in its directory, FR-Spec style; the layer draft ``embedded:smollm2-135m-draft`` has 8,192 of
the target's 49,152 tokens) served by vLLM as it was trained: its LM head's rows of those
tokens only, every other token -inf (``semspec.engine.reduced_vocab_model``).

vLLM picks a model's class from ``architectures`` in its config. The model directory is left
as it is (the file is part of its identity, the config names the plain architecture that
transformers loads): the engine that serves it is handed ``hf_overrides`` naming our subclass
of that architecture instead (``engine_args``, called by ``semspec.engine.step_engine``'s
``ModelFiles.serve``, which starts the step engines' draft engine, probe calibration's
included). ``MODEL_CLASSES`` is what ``semspec.engine.head_plugin.register`` adds to vLLM's
model registry, as it does the draft head's. Names only here: nothing imports vLLM until an
engine loads one of these classes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from semspec.models.reduced_vocab import VOCAB_SUBSET_FILE

_MODULE = "semspec.engine.reduced_vocab_model"
# the architecture a model directory names -> ours that runs it with its reduced vocabulary
ARCHITECTURES = {
    "LlamaForCausalLM": "SemspecReducedVocabLlamaForCausalLM",
    "Qwen2ForCausalLM": "SemspecReducedVocabQwen2ForCausalLM",
    "Qwen3ForCausalLM": "SemspecReducedVocabQwen3ForCausalLM",
}
# ours -> where vLLM's registry finds it ("module:class", imported when an engine loads it)
MODEL_CLASSES = {ours: f"{_MODULE}:{ours}" for ours in ARCHITECTURES.values()}


def engine_args(model_dir: str | os.PathLike, config: Any, user: dict | None) -> dict | None:
    """vLLM's engine arguments ``user`` for the engine of the model in ``model_dir`` (transformers
    config ``config``), with ``hf_overrides`` naming our class of its architecture where the
    directory declares a reduced vocabulary (the caller makes that class known to vLLM:
    ``head_plugin.register``);
    ``user`` itself otherwise. Keys of the user's own ``hf_overrides`` are kept beside ours, and
    win (an ``architectures`` of theirs runs the class they name). Refused (ValueError): an
    architecture we have no class for, and tensor or pipeline parallelism (the LM head's rows
    are gathered whole on one device)."""
    if not (Path(model_dir) / VOCAB_SUBSET_FILE).is_file():
        return user
    user = dict(user or {})
    named = list(getattr(config, "architectures", None) or [])
    if len(named) != 1 or named[0] not in ARCHITECTURES:
        raise ValueError(f"{model_dir} has a reduced vocabulary ({VOCAB_SUBSET_FILE}): vLLM runs one for "
                         f"{', '.join(ARCHITECTURES)} only, not {named}")
    split = {k: user[k] for k in ("tensor_parallel_size", "pipeline_parallel_size") if (user.get(k) or 1) > 1}
    if split:
        raise ValueError(f"{model_dir} has a reduced vocabulary ({VOCAB_SUBSET_FILE}): its engine runs on one "
                         f"device, not {split}")
    user["hf_overrides"] = {"architectures": [ARCHITECTURES[named[0]]], **(user.get("hf_overrides") or {})}
    return user

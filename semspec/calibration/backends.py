"""The pair a calibration samples from: on vLLM where it is installed, else on transformers'
forward (``semspec.calibration.collect`` reads either through ``CalibrationModels``)."""

from __future__ import annotations

from semspec.calibration.collect import CalibrationModels, CollectConfig
from semspec.calibration.transformers_models import TransformersModels
from semspec.calibration.vllm_models import VLLMModels
from semspec.components import step_draft_problem
from semspec.models.loaded import load_model
from semspec.engine.token_engine import vllm_installed


def load_models(target: str, draft: str | None, cfg: CollectConfig, device: str = "auto",
                **vllm_options) -> CalibrationModels:
    """The pair to calibrate: on vLLM where it is installed, storing the layers ``cfg`` reads,
    with ``vllm_options`` (``VLLMStepEngine.load``'s: a worker's settings), else on
    transformers' forward. A draft head drafts no steps (``semspec.components``): refused."""
    problem = step_draft_problem("semspec", draft)
    if problem is not None:
        raise ValueError(problem)
    if vllm_installed():
        return VLLMModels.load(target, draft, cfg, device=device, **vllm_options)
    tgt = load_model(target, device=device)
    return TransformersModels(tgt, load_model(draft, device=device) if draft else None)

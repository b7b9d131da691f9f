"""How much the target likes a text: its mean per-token log-likelihood, the quality measure
every comparison of methods reports beside speed (``semjobs bench``, ``semjobs compare``)."""

from __future__ import annotations

import torch

from semspec.prompts import encode_prompt


def load_scorer(spec: str | None, cache_dir=None):
    """The target that scores texts (a ``LoadedModel``): float32 on the CPU whatever the
    decode ran in, so that scores compare across machines and number types. ``cache_dir``:
    semjobs' cache directory (None: the default)."""
    from transformers.utils import logging as transformers_logging

    from semspec.models.identity import models_cache
    from semspec.models.loaded import load_model

    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # a command's one line of output, not a loading bar
    try:
        return load_model(spec, device="cpu", cache_dir=models_cache(cache_dir), dtype=torch.float32)
    finally:
        if bars:
            transformers_logging.enable_progress_bar()


@torch.inference_mode()
def target_mean_loglik(target, prompt: str, text: str) -> float | None:
    """Mean log-probability per token the target gives ``text`` after ``prompt`` (teacher forced)."""
    tok = target.tokenizer
    p = encode_prompt(tok, prompt)
    o = tok(text, add_special_tokens=False)["input_ids"] if text else []
    if not o:
        return None
    ids = p + o
    if target.max_context is not None and len(ids) > target.max_context:
        ids = ids[: target.max_context]
        o = ids[len(p):]
    x = torch.tensor([ids], device=target.device)
    logits = target.model(input_ids=x).logits[0, len(p) - 1: len(ids) - 1].float()
    lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(o, device=logits.device)[:, None])
    return float(lp.mean())

"""How much the target likes a text: its mean per-token log-likelihood, the quality measure
every comparison of methods reports beside speed (``semjobs bench``, ``semjobs compare``)."""

from __future__ import annotations

import torch

from semspec.prompts import encode_prompt


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

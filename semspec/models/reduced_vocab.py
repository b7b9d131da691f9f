"""A draft that predicts part of the vocabulary only (FR-Spec style): its LM head runs over
those rows, every other token gets -inf. The ids are part of the model directory
(``semspec_vocab.json``) and of its identity."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from semspec.models.paths import ModelLoadError

VOCAB_SUBSET_FILE = "semspec_vocab.json"


def read_vocab_subset(model_dir: Path, device) -> torch.Tensor | None:
    """The reduced vocabulary a model directory declares, if any."""
    path = model_dir / VOCAB_SUBSET_FILE
    if not path.is_file():
        return None
    ids = json.loads(path.read_text())["token_ids"]
    if not ids or len(set(ids)) != len(ids):
        raise ModelLoadError(f"{path}: token_ids must be a non-empty list of distinct ids")
    return torch.tensor(sorted(ids), dtype=torch.long, device=device)


def reduced_head_logits(hidden: torch.Tensor, rows: torch.nn.Linear, ids: torch.Tensor, vocab_size: int):
    """Logits over the whole vocabulary from ``rows``, the LM head's rows of ``ids`` only:
    -inf elsewhere."""
    return full_vocab_logits(rows(hidden), ids, vocab_size)


def full_vocab_logits(reduced: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``reduced`` (logits of the tokens ``ids``, in the last dimension) over the whole
    vocabulary: -inf for every other token (here, in vLLM's drafters)."""
    logits = reduced.new_full((*reduced.shape[:-1], vocab_size), float("-inf"))
    logits[..., ids] = reduced
    return logits


class ReducedHead(torch.nn.Module):
    """An LM head over the reduced vocabulary, in place of the full one."""

    def __init__(self, rows: torch.nn.Linear, ids: torch.Tensor, vocab_size: int):
        super().__init__()
        self.rows, self.ids, self.vocab_size = rows, ids, vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return reduced_head_logits(hidden, self.rows, self.ids, self.vocab_size)

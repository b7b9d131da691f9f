"""One model's incremental view of one sequence: token ids + KV cache + next-token logits.

Invariant: ``cache`` holds keys/values for ``ids[:cached]``; ``ids[cached:]`` are *pending*
tokens (appended but not yet run), fed with the next forward pass. ``next_logits`` are the
logits after ``ids[:cached]`` and are only valid when nothing is pending. Rolling back
(``truncate``) crops the cache (``DynamicCache.crop``) and restores the logits from the last
pass when it covered that position, so a rejection never costs an extra pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models import LoadedModel


@dataclass
class ForwardOut:
    # [n, V] float32, one row per entry of ``rows``; the last row predicts the next token
    logits: torch.Tensor
    hidden: torch.Tensor | None  # [n_fed, H] states of the requested layer, or None
    start: int  # absolute position of the first fed token
    rows: list[int]  # fed-token offsets whose logits were computed (all unless keep_for)


class Stream:
    def __init__(self, lm: LoadedModel, ids: list[int]):
        from transformers import DynamicCache

        self.lm = lm
        self.ids: list[int] = list(ids)
        self.cache = DynamicCache(config=lm.model.config)
        self.cached = 0
        self._tail_logits: torch.Tensor | None = None  # logits after ids[:cached]
        self.forward_passes = 0
        self.fed_tokens = 0
        # position -> logits predicting it, from the last pass: restored on rollback
        self._rollback_logits: dict[int, torch.Tensor | None] = {}

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def pending(self) -> list[int]:
        return self.ids[self.cached:]

    @property
    def next_logits(self) -> torch.Tensor | None:
        return self._tail_logits if self.cached == len(self.ids) else None

    def append(self, tokens: list[int]) -> None:
        self.ids.extend(int(t) for t in tokens)

    @torch.inference_mode()
    def forward(self, extra: list[int] = (), hidden_layer: int | None = None,
                keep_for: list[int] | None = None) -> ForwardOut:
        """Run pending tokens + ``extra`` (appended to ``ids``) in one pass.

        ``keep_for``: absolute positions whose predicting logits the caller will need (to
        verify or to roll back to); the LM head then runs only for those rows and the last
        one, which matters for a long pass through a large vocabulary. None keeps every row."""
        self.append(list(extra))
        feed = self.ids[self.cached:]
        if not feed:
            raise RuntimeError("nothing to feed")
        start = self.cached
        max_ctx = self.lm.max_context
        if max_ctx is not None and len(self.ids) > max_ctx:
            raise ContextOverflow(f"sequence of {len(self.ids)} tokens exceeds the model's context of {max_ctx}")
        x = torch.tensor([feed], dtype=torch.long, device=self.lm.device)
        if keep_for is None:
            rows = list(range(len(feed)))
            keep: int | torch.Tensor = 0
        else:
            # row r holds the logits predicting position start + r + 1
            rows = sorted({p - 1 - start for p in keep_for if 0 <= p - 1 - start < len(feed)} | {len(feed) - 1})
            keep = 1 if rows == [len(feed) - 1] else torch.tensor(rows, device=self.lm.device)
        logits, states = self.lm.forward(x, self.cache, hidden_layer is not None, keep)
        self.forward_passes += 1
        self.fed_tokens += len(feed)
        hidden = states[hidden_layer][0].float() if hidden_layer is not None else None
        # logits predicting each covered position, to restore on rollback (the position the
        # pass started at is predicted by the logits from before it)
        self._rollback_logits = {start: self._tail_logits}
        self._rollback_logits.update({start + r + 1: logits[i] for i, r in enumerate(rows)})
        self.cached = len(self.ids)
        self._tail_logits = logits[-1]
        return ForwardOut(logits, hidden, start, rows)

    def logits(self) -> torch.Tensor:
        """Next-token logits after all ids, running a pass only if needed."""
        if self.next_logits is not None and self.cached == len(self.ids):
            return self.next_logits
        if self.cached == len(self.ids):  # logits lost (e.g. state rebuilt): re-run the last token
            self._crop_cache(len(self.ids) - 1)
        self.forward()
        return self.next_logits

    def logits_before(self, position: int) -> torch.Tensor | None:
        """Logits predicting ``ids[position]`` if the last pass (or the state before it) has them."""
        return self._rollback_logits.get(position)

    def truncate(self, length: int) -> None:
        """Drop ``ids[length:]``, cropping the cache to match."""
        if length < 0 or length > len(self.ids):
            raise ValueError(f"cannot truncate {len(self.ids)} ids to {length}")
        if length == len(self.ids):
            return
        if length > self.cached:  # only pending tokens go
            self.ids = self.ids[:length]
            return
        restored = self.logits_before(length)
        self.ids = self.ids[:length]
        self._crop_cache(length)
        self._tail_logits = restored

    def refeed_from(self, position: int) -> None:
        """Drop the cache from ``position`` on, keeping the ids: the next pass runs them
        again (to get back states or logits that were not kept)."""
        if not 0 <= position <= self.cached:
            raise ValueError(f"cannot re-feed from {position}: {self.cached} tokens are cached")
        self._crop_cache(position)

    def _crop_cache(self, length: int) -> None:
        n = self.cached - length
        if n > 0:
            self.cache.crop(-n)
            self._tail_logits = None
        self.cached = length


class ContextOverflow(ValueError):
    pass

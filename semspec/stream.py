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
    # [n, V] float32 for the last n fed positions (all of them unless keep_last was given);
    # the last row predicts the next token
    logits: torch.Tensor
    hidden: torch.Tensor | None  # [n_fed, H] states of the requested layer, or None
    start: int  # absolute position of the first fed token


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
        # the last pass, kept to restore logits on rollback
        self._last_start = 0
        self._last_logits: torch.Tensor | None = None
        self._before_last: torch.Tensor | None = None

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
                keep_last: int | None = None) -> ForwardOut:
        """Run pending tokens + ``extra`` (appended to ``ids``) in one pass. ``keep_last``
        computes logits for the last positions only (a prefill needs one row)."""
        self.append(list(extra))
        feed = self.ids[self.cached:]
        if not feed:
            raise RuntimeError("nothing to feed")
        start = self.cached
        max_ctx = self.lm.max_context
        if max_ctx is not None and len(self.ids) > max_ctx:
            raise ContextOverflow(f"sequence of {len(self.ids)} tokens exceeds the model's context of {max_ctx}")
        x = torch.tensor([feed], dtype=torch.long, device=self.lm.device)
        keep = 0 if keep_last is None or keep_last >= len(feed) else int(keep_last)
        out = self.lm.model(
            input_ids=x, cache=self.cache, use_cache=True, output_hidden_states=hidden_layer is not None,
            logits_to_keep=keep,
        )
        self.forward_passes += 1
        self.fed_tokens += len(feed)
        logits = out.logits[0].float()
        hidden = None
        if hidden_layer is not None:
            hidden = out.hidden_states[hidden_layer][0].float()
        self._before_last = self._tail_logits if keep == 0 else None
        self._last_start = start + len(feed) - logits.shape[0]  # position of the first kept row
        self._last_logits = logits
        self.cached = len(self.ids)
        self._tail_logits = logits[-1]
        return ForwardOut(logits, hidden, start)

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
        if self._last_logits is None:
            return None
        row = position - 1 - self._last_start
        if 0 <= row < self._last_logits.shape[0]:
            return self._last_logits[row]
        if row == -1:
            return self._before_last
        return None

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

    def _crop_cache(self, length: int) -> None:
        n = self.cached - length
        if n > 0:
            self.cache.crop(-n)
            self._tail_logits = None
        self.cached = length


class ContextOverflow(ValueError):
    pass

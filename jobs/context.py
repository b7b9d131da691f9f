"""Whether each prompt fits the target's context, told at submit time by the target's own
tokenizer, so a prompt that cannot run is refused with the rest of the bad input instead of
failing when a worker reaches it.

Only prompts of at least ``MIN_CHECKED_BYTES`` bytes are tokenized (a token covers at least
one byte, and no served model has a context that short), so a file of ordinary prompts costs
nothing and the tokenizer is loaded only when a long one comes. When the target's files are
not on the submitting machine the check is skipped, and says so.
"""

from __future__ import annotations

from typing import Any

MIN_CHECKED_BYTES = 1024


class ContextCheck:
    def __init__(self, target_spec: str | None, cache_dir):
        """``cache_dir``: the semjobs cache directory (its models live in ``models_cache`` of it)."""
        self.target_spec, self.cache_dir = target_spec, cache_dir
        self._tokenizer: Any = None
        self.max_context: int | None = None
        self.unavailable: str | None = None  # why the check could not run

    def _load(self) -> bool:
        if self._tokenizer is None and self.unavailable is None:
            from semspec.models.identity import models_cache
            from semspec.models.paths import ModelLoadError
            from semspec.models.specs import load_tokenizer

            try:
                self._tokenizer, self.max_context = load_tokenizer(self.target_spec, models_cache(self.cache_dir))
            except (ModelLoadError, OSError, ValueError, ImportError) as e:
                self.unavailable = f"{type(e).__name__}: {e}"
        return self._tokenizer is not None

    def __call__(self, prompt, template_kwargs: dict | None = None) -> str | None:
        """The problem with ``prompt`` (a text or messages), or None when it fits."""
        texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
        if sum(len(t.encode("utf-8")) for t in texts) < MIN_CHECKED_BYTES or not self._load():
            return None
        from semspec.prompts import encode_prompt

        try:
            n = len(encode_prompt(self._tokenizer, prompt, template_kwargs))
        except Exception as e:  # noqa: BLE001  (the chat template refused it: a bad line, not a crash)
            return f"the target's chat template cannot render it: {type(e).__name__}: {e}"
        if self.max_context is not None and n >= self.max_context:
            return f"prompt of {n} tokens does not fit the target's context of {self.max_context} tokens"
        return None

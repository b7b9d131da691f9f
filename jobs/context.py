"""Whether each prompt renders and fits the target's context, told at submit time by the
target's own tokenizer and chat template, so a line that cannot run is refused with the rest
of the bad input instead of failing when a worker reaches it.

Tokenized are the prompts of at least ``MIN_CHECKED_BYTES`` bytes (a token covers at least
one byte, and no served model has a context that short) and the first line of every distinct
``chat_template_kwargs`` set (a template may refuse a value, e.g. a ``reasoning_effort`` it
does not know), so a file of ordinary prompts costs nothing and the tokenizer is loaded only
when one of those comes. When the target's files are not on the submitting machine the check
is skipped, and says so.
"""

from __future__ import annotations

import json
from typing import Any

MIN_CHECKED_BYTES = 1024


class ContextCheck:
    def __init__(self, target_spec: str | None, cache_dir):
        """``cache_dir``: the semjobs cache directory (its models live in ``models_cache`` of it)."""
        self.target_spec, self.cache_dir = target_spec, cache_dir
        self._tokenizer: Any = None
        self.max_context: int | None = None
        self.unavailable: str | None = None  # why the check could not run
        self._rendered_kwargs: set[str] = set()  # the chat_template_kwargs sets tried, as JSON

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

    def _new_kwargs(self, template_kwargs: dict | None) -> bool:
        """Whether this set of chat_template_kwargs is the first of its kind (JSON tells
        True from 1, which hash alike)."""
        if not template_kwargs:
            return False
        key = json.dumps(template_kwargs, sort_keys=True)
        if key in self._rendered_kwargs:
            return False
        self._rendered_kwargs.add(key)
        return True

    def __call__(self, prompt, template_kwargs: dict | None = None) -> tuple[str, str] | None:
        """The part at fault ("prompt" or "chat_template_kwargs") and the problem with
        ``prompt`` (a text or messages) rendered with ``template_kwargs``, or None when it
        renders and fits (or is not checked)."""
        texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
        is_long = sum(len(t.encode("utf-8")) for t in texts) >= MIN_CHECKED_BYTES
        if not (self._new_kwargs(template_kwargs) or is_long) or not self._load():
            return None
        from semspec.prompts import encode_prompt

        try:
            n = len(encode_prompt(self._tokenizer, prompt, template_kwargs))
        except Exception as e:  # noqa: BLE001  (the chat template refused it: a bad line, not a crash)
            return self._render_problem(prompt, template_kwargs, e)
        if self.max_context is not None and n >= self.max_context:
            return "prompt", f"prompt of {n} tokens does not fit the target's context of {self.max_context} tokens"
        return None

    def _render_problem(self, prompt, template_kwargs: dict | None, error: Exception) -> tuple[str, str]:
        """Which part the chat template refused: the kwargs when the prompt renders without
        them, else the prompt."""
        reason = f"{type(error).__name__}: {error}"
        if template_kwargs and self._renders(prompt):
            return "chat_template_kwargs", f"the target's chat template cannot render the prompt with it: {reason}"
        return "prompt", f"the target's chat template cannot render it: {reason}"

    def _renders(self, prompt) -> bool:
        from semspec.prompts import encode_prompt

        try:
            encode_prompt(self._tokenizer, prompt)
        except Exception:  # noqa: BLE001  (any refusal: the prompt itself is at fault)
            return False
        return True

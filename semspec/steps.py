"""Reasoning steps: where a step ends, splitting text into steps.

A step ends with the token whose text *completes* the delimiter (default a blank line,
``"\\n\\n"``). Tokenizers merge punctuation and newlines (``".\\n\\n"``, ``"\\n\\n\\n"``), so
this is decided on the decoded text, never on one token id. A delimiter only counts once
the step holds some non-blank text, so runs of blank lines do not make empty steps. An
end-of-thinking marker (e.g. ``"</think>"``) also ends a step.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_END_CANDIDATES = ("</think>",)


@dataclass
class StepEnd:
    reason: str  # "delimiter", "think_end", "cap"


class StepDetector:
    """Decides, from a step's text so far, whether it has ended."""

    def __init__(self, delimiter: str = "\n\n", think_end: str | None = None, max_step_tokens: int = 64):
        if not delimiter:
            raise ValueError("the step delimiter must not be empty")
        if max_step_tokens < 1:
            raise ValueError("max_step_tokens must be at least 1")
        self.delimiter = delimiter
        self.think_end = think_end or None
        self.max_step_tokens = max_step_tokens

    def ended(self, text: str, n_tokens: int, prev_len: int = 0) -> StepEnd | None:
        """``text``: the whole step so far; ``prev_len``: its length before the last token,
        so only delimiter occurrences completed by that token count."""
        if self.think_end and self.think_end in text[max(0, prev_len - len(self.think_end) + 1):]:
            return StepEnd("think_end")
        d = self.delimiter
        start = max(0, prev_len - len(d) + 1)
        pos = text.find(d, start)
        while pos != -1:
            if text[:pos].strip():
                return StepEnd("delimiter")
            pos = text.find(d, pos + 1)
        if n_tokens >= self.max_step_tokens:
            return StepEnd("cap")
        return None


class IncrementalText:
    """The text of a growing run of token ids, decoded a few tokens at a time instead of all
    of them at every token. ``prefix`` is text that precedes the ids (e.g. the target's
    words that open a step the draft continues).

    Each new token is decoded together with the few before it and only the difference is
    appended. When the new token changes how its neighbours read (the second half of a
    multi-byte character turns a U+FFFD into the character), the text is decoded whole
    again, so ``text`` is always what a whole decode gives."""

    CONTEXT = 4

    def __init__(self, tokenizer, ids=(), prefix: str = ""):
        self.tokenizer = tokenizer
        self.ids: list[int] = [int(t) for t in ids]
        self.prefix = prefix
        self.text = prefix + self._decode(self.ids)

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False) if ids else ""

    def push(self, token: int) -> str:
        """Append one token; returns the text it added."""
        ctx = max(0, len(self.ids) - self.CONTEXT)
        before = self._decode(self.ids[ctx:])
        self.ids.append(int(token))
        after = self._decode(self.ids[ctx:])
        if not after.startswith(before):  # the new token re-reads its neighbours: decode it all
            old, self.text = self.text, self.prefix + self._decode(self.ids)
            return self.text[len(old):] if self.text.startswith(old) else ""
        new = after[len(before):]
        self.text += new
        return new


def split_steps(text: str, delimiter: str = "\n\n") -> list[str]:
    """Cut a reasoning trace into steps, each keeping its trailing delimiter, so that
    ``"".join(split_steps(t)) == t``. Leading blank text joins the first step."""
    steps: list[str] = []
    cur = 0
    i = text.find(delimiter)
    while i != -1:
        if text[cur:i].strip():
            end = i + len(delimiter)
            steps.append(text[cur:end])
            cur = end
            i = text.find(delimiter, cur)
        else:
            i = text.find(delimiter, i + 1)
    if cur < len(text):
        if steps and not text[cur:].strip():
            steps[-1] += text[cur:]
        else:
            steps.append(text[cur:])
    return steps


def detect_think_end(tokenizer) -> str | None:
    """The end-of-thinking marker when the tokenizer has one as a token (R1/QwQ style)."""
    vocab = tokenizer.get_vocab()
    for m in THINK_END_CANDIDATES:
        if m in vocab:
            return m
    return None


def step_spans(tokenizer, ids: list[int], detector: StepDetector) -> list[tuple[int, int]]:
    """Where the steps of generated token ids begin and end (``[start, end)`` offsets into
    ``ids``), cut as a sequence writing them token by token cuts them: each step ends at the
    token that ends it (``StepDetector``), the rest is the last step."""
    spans: list[tuple[int, int]] = []
    start = 0
    text = IncrementalText(tokenizer)
    for i, token in enumerate(ids):
        prev_len = len(text.text)
        text.push(token)
        if detector.ended(text.text, len(text.ids), prev_len) is not None:
            spans.append((start, i + 1))
            start = i + 1
            text = IncrementalText(tokenizer)
    if start < len(ids):
        spans.append((start, len(ids)))
    return spans

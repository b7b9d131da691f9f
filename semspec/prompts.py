"""A prompt as the target reads it: its token ids, and step_judge's judging question.

Shared by the engines and by probe calibration, so that every one renders a prompt alike.
"""

from __future__ import annotations

from .models import encode_prompt, render_prompt


class PromptError(ValueError):
    """The prompt cannot be decoded (empty, or longer than the model's context)."""


class MethodUnavailable(ValueError):
    """The method needs a model or probes the engine was not given."""


def prompt_ids(tokenizer, messages, template_kwargs: dict | None, max_context: int | None) -> list[int]:
    """The prompt's token ids (its chat template applied); PromptError when it cannot be
    rendered, is empty or leaves no room in the context."""
    try:
        ids = encode_prompt(tokenizer, messages, template_kwargs)
    except ValueError as e:
        raise PromptError(str(e)) from e
    if not ids:
        raise PromptError("empty prompt")
    if max_context is not None and len(ids) >= max_context:
        raise PromptError(f"prompt of {len(ids)} tokens does not fit the target's context of {max_context} tokens")
    return ids


JUDGE_QUESTION = (
    "Rate the correctness and usefulness of the last step of your reasoning above on a scale "
    "from 0 (wrong or useless) to 9 (correct and useful). Answer with a single digit."
)
_PLACEHOLDER = "\u2063SEMSPEC_STEP\u2063"


def judge_suffix(tokenizer, question: str = JUDGE_QUESTION) -> str:
    """Text that closes the assistant's partial turn, asks the judging question, and opens
    the answer with "Score: ", rendered with the tokenizer's own chat template."""
    if getattr(tokenizer, "chat_template", None):
        full = render_prompt(
            tokenizer,
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": _PLACEHOLDER},
             {"role": "user", "content": question}],
        )
        if _PLACEHOLDER in full:
            return full.split(_PLACEHOLDER, 1)[1] + "Score: "
    return f"\n\n{question}\nScore: "


def judge_prompt(tokenizer) -> tuple[list[int], list[int]]:
    """step_judge's question after a step (``judge_suffix``) and the ten digits' token ids;
    MethodUnavailable when a digit is not one token."""
    digits = []
    for d in "0123456789":
        ids = tokenizer(d, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise MethodUnavailable(f"step_judge needs single-token digits; {d!r} is {ids}")
        digits.append(ids[0])
    return tokenizer(judge_suffix(tokenizer), add_special_tokens=False)["input_ids"], digits

"""A prompt as the target reads it: the chat template rendered, its token ids, and
step_judge's judging question.

Shared by the engines and by probe calibration, so that every one renders a prompt alike.
"""

from __future__ import annotations


class PromptError(ValueError):
    """The prompt cannot be decoded (empty, or longer than the model's context)."""


class MethodUnavailable(ValueError):
    """The method needs a model or probes the engine was not given."""


# The chat template variables a request may set (its ``chat_template_kwargs``): the switches
# reasoning models' templates read (Qwen3's ``enable_thinking``, DeepSeek-V3.1's ``thinking``,
# gpt-oss's ``reasoning_effort``), each a scalar. Any other key reaches
# ``apply_chat_template`` as an argument of its own: ``tokenize`` breaks decoding, ``chat_template``
# runs the submitter's own Jinja, ``add_generation_prompt`` is the engine's to set (``render_prompt``).
TEMPLATE_KWARGS = ("enable_thinking", "thinking", "reasoning_effort")
TEMPLATE_VALUE_TYPES = (str, int, float, bool, type(None))


class TemplateKwargsError(ValueError):
    """A chat_template_kwargs key outside ``TEMPLATE_KWARGS``, or a value that is not a scalar."""

    def __init__(self, key: str, message: str):
        # repr's escapes: a key read back from an older row may hold what no error column takes
        super().__init__(f"chat_template_kwargs.{repr(key)[1:-1]}: {message}")
        self.key, self.reason = key, message


def check_template_kwargs(kwargs: dict) -> None:
    """Raise TemplateKwargsError at the first key a request may not pass to the chat template.
    The validator calls it at submit, the engines again before each render."""
    for key, value in kwargs.items():
        if key not in TEMPLATE_KWARGS:
            raise TemplateKwargsError(key, f"not allowed (the chat template takes {', '.join(TEMPLATE_KWARGS)})")
        if not isinstance(value, TEMPLATE_VALUE_TYPES):
            raise TemplateKwargsError(key, f"must be a string, number, boolean or null, got {type(value).__name__}")


def render_prompt(tokenizer, messages: list[dict] | str, add_generation_prompt: bool = True,
                  template_kwargs: dict | None = None) -> str:
    """The prompt text for ``messages`` (a string is one user message), through the
    tokenizer's chat template when it has one (``template_kwargs`` are passed to it), else a
    plain ``role: content`` transcript."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not messages or not any(str(m.get("content") or "").strip() for m in messages):
        raise ValueError("empty prompt: no message has any content")
    check_template_kwargs(template_kwargs or {})
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **(template_kwargs or {}))
    text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
    return text + ("\nassistant: " if add_generation_prompt else "")


def encode_prompt(tokenizer, messages: list[dict] | str, template_kwargs: dict | None = None) -> list[int]:
    """Token ids of the rendered prompt (special tokens come from the template itself)."""
    text = render_prompt(tokenizer, messages, template_kwargs=template_kwargs)
    ids = tokenizer(text, add_special_tokens=not getattr(tokenizer, "chat_template", None))["input_ids"]
    return list(ids)


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

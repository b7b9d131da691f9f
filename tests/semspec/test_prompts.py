"""The chat_template_kwargs allow-list, enforced where prompts are rendered (the engines'
defence in depth behind submit's validation)."""

from __future__ import annotations

import pytest

from semspec.prompts import (TEMPLATE_KWARGS, PromptError, TemplateKwargsError, check_template_kwargs,
                             prompt_ids, render_prompt)


class TemplateTokenizer:
    """A tokenizer with a chat template: records what reaches apply_chat_template."""

    chat_template = "{{ messages }}"

    def __init__(self):
        self.calls: list[dict] = []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append(kwargs)
        return " ".join(m["content"] for m in messages)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": list(range(len(text.split())))}


@pytest.mark.parametrize("kwargs, key, words", [
    ({"tokenize": True}, "tokenize", "not allowed"),
    ({"chat_template": "{{ 'mine' }}"}, "chat_template", "not allowed"),
    ({"add_generation_prompt": False}, "add_generation_prompt", "not allowed"),
    ({"enable_thinking": True, "documents": []}, "documents", "not allowed"),
    ({"enable_thinking": [True]}, "enable_thinking", "must be a string, number, boolean or null"),
    ({"reasoning_effort": {"level": "high"}}, "reasoning_effort", "must be a string, number, boolean or null"),
])
def test_a_key_outside_the_allow_list_never_reaches_the_template(kwargs, key, words):
    tok = TemplateTokenizer()
    with pytest.raises(TemplateKwargsError) as e:
        render_prompt(tok, "q", template_kwargs=kwargs)
    assert e.value.key == key and words in str(e.value) and str(e.value).startswith(f"chat_template_kwargs.{key}: ")
    assert tok.calls == []
    # the engines fail the one request with its reason (a PromptError is a ValueError they catch per request)
    with pytest.raises(PromptError, match=f"chat_template_kwargs.{key}"):
        prompt_ids(tok, "q", kwargs, max_context=100)


def test_allowed_scalar_kwargs_reach_the_template_beside_the_engines_own_arguments():
    tok = TemplateTokenizer()
    kwargs = {"enable_thinking": False, "thinking": None, "reasoning_effort": "high"}
    assert prompt_ids(tok, "two words", kwargs, max_context=100) == [0, 1]
    assert tok.calls == [{"tokenize": False, "add_generation_prompt": True, **kwargs}]


def test_no_allowed_key_is_an_argument_of_apply_chat_template():
    """An allowed key must only ever be a template variable: one that named an argument of
    apply_chat_template would change how the engine renders (tokenize, chat_template, ...)."""
    import inspect

    from transformers import PreTrainedTokenizerBase

    arguments = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    assert {"tokenize", "chat_template", "add_generation_prompt"} <= arguments
    assert not arguments & set(TEMPLATE_KWARGS)


def test_a_key_that_cannot_be_printed_is_named_by_its_escapes():
    with pytest.raises(TemplateKwargsError, match=r"chat_template_kwargs\.k\\x00: not allowed"):
        check_template_kwargs({"k\x00": 1})

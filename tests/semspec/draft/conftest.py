import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


class CharTokenizer:
    """A minimal tokenizer for tiny random models: one id per character."""

    chat_template = None
    eos_token_id = 2
    pad_token_id = 2

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + (ord(c) % 120) for c in text]}

    def save_pretrained(self, path):
        pass


def tiny_target(seed: int = 0, layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def tokenizer():
    return CharTokenizer()


@pytest.fixture
def target():
    return tiny_target()


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "gsm.jsonl"
    with path.open("w") as fh:
        for i in range(14):
            fh.write(json.dumps({"question": f"What is {i} plus {i + 1}?",
                                 "answer": f"{i} + {i + 1} = <<{i}+{i + 1}={2 * i + 1}>>{2 * i + 1}\n#### {2 * i + 1}"}) + "\n")
    return str(path)

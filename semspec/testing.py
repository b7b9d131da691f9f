"""Tiny randomly initialised models and tokenizers for fast tests (no files needed).

``tiny_model_dir(path, ...)`` writes a complete Hugging Face directory (Llama, Qwen2 or Qwen3
config, random weights, a small byte-level BPE tokenizer trained on a fixed text, a chat template) that
:func:`semspec.models.loaded.load_model` loads like any real model.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)

_CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May?",
    "Step 1: She sold 48 / 2 = 24 clips in May.\n\nStep 2: 48 + 24 = 72.\n\nThe answer is 72.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "#### 10\n\nSo the total is \\boxed{10}.\n\n",
    "Let's think step by step.\n\nFirst, compute the cost.\n\nThen add them up.\n\n",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 = + - * / ( ) . , : ; ? !",
]


def tiny_tokenizer(vocab_size: int = 320, seed_text: str = ""):
    """A byte-level BPE tokenizer with im_start/im_end special tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20 + ([seed_text] * 20 if seed_text else []), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# The decoder layouts semjobs' models come in (a draft head's layers among them), by transformers model type.
ARCHITECTURES = ("llama", "qwen2", "qwen3")


def tiny_model(tokenizer, num_layers: int = 2, hidden_size: int = 64, seed: int = 0, max_positions: int = 512,
               arch: str = "llama"):
    import transformers

    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[arch]
    cfg = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = model_cls(cfg)
    # Random init gives near-uniform logits; a larger untied head sharpens them (so greedy
    # and sampled decoding differ) without making the model repeat its input token.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.35)
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
    return model.eval()


def tiny_model_dir(path, num_layers: int = 2, hidden_size: int = 64, seed: int = 0, vocab_size: int = 320,
                   seed_text: str = "", max_positions: int = 512, arch: str = "llama") -> Path:
    path = Path(path)
    tok = tiny_tokenizer(vocab_size, seed_text)
    model = tiny_model(tok, num_layers, hidden_size, seed, max_positions, arch)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def aborting_source(requests):
    """A request source that aborts in a full batch of 2, for an engine's ``generate_many``:
    an Abort of a key not in flight (finished, say: nothing happens), ``requests[0]`` and
    ``[1]`` (the batch is full), None (read in the full batch: one step runs), an Abort of
    ``requests[0]``, then ``requests[2]``, which takes its slot."""
    from semspec.types import Abort

    yield Abort("gone")
    yield requests[0]
    yield requests[1]
    yield None
    yield Abort(requests[0].key)
    yield requests[2]

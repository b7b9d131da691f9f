"""Tiny randomly initialised models and tokenizers for fast tests (no files needed).

``tiny_model_dir(path, ...)`` writes a complete Hugging Face directory (Llama, Qwen2 or Qwen3
config, random weights, a small byte-level BPE tokenizer trained on a fixed text, a chat template) that
:func:`semspec.models.loaded.load_model` loads like any real model; ``thinking=True`` makes it a
reasoning model's: ``<think>`` and ``</think>`` tokens, a Qwen3-shaped template, and ``</think>``
written now and then. ``write_eagle3_head`` writes a random EAGLE-3 head for such a target, as
published ones are laid out. ``lay_out_hub_cache`` puts a directory into a Hugging Face cache as
the hub's client does, for tests that name models by hub name offline (``use_hub_cache``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)

THINK_START, THINK_END = "<think>", "</think>"
# Qwen3's template in small: the model opens its thinking itself unless enable_thinking is
# false, when the prompt holds an empty thought; an earlier assistant turn keeps only its answer
THINKING_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and '</think>' in m['content'] %}"
    "{{ m['content'].split('</think>')[-1].lstrip() }}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
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


def tiny_tokenizer(vocab_size: int = 320, seed_text: str = "", thinking: bool = False):
    """A byte-level BPE tokenizer with im_start/im_end special tokens and a chat template;
    ``thinking``: also ``<think>`` / ``</think>`` tokens and THINKING_CHAT_TEMPLATE."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
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
    if thinking:
        # not special, as in Qwen3's tokenizer: decoding keeps them in the text
        fast.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])
        fast.chat_template = THINKING_CHAT_TEMPLATE
    return fast


NUM_HEADS = 4
# </think>'s logit in a thinking model: written at about one position in ten at T 0.6 (the
# other logits spread about 5.6 wide), so a trace of a few dozen tokens holds one
THINK_END_LOGIT = 10.0
# The decoder layouts semjobs' models come in (a draft head's layers among them), by transformers model type.
ARCHITECTURES = ("llama", "qwen2", "qwen3")


def tiny_model(tokenizer, num_layers: int = 2, hidden_size: int = 64, seed: int = 0, max_positions: int = 512,
               arch: str = "llama", think_end_logit: float | None = None):
    """A random model of ``arch``; ``think_end_logit``: ``</think>`` gets about this logit at
    every position (``_write_everywhere``)."""
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
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=2,
        head_dim=hidden_size // NUM_HEADS,  # Qwen3's config would take 128 whatever the width
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
    if think_end_logit is not None:
        _write_everywhere(model, tokenizer.convert_tokens_to_ids(THINK_END), think_end_logit)
    return model.eval()


def _write_everywhere(model, token_id: int, logit: float) -> None:
    """Give ``token_id`` about ``logit`` at every position, whatever came before (a random
    model would write ``</think>`` about never): the residual stream's first dimension holds
    one value from the embedding on (no layer writes to it), which only ``token_id``'s output
    row reads. The final norm scales that dimension to about 1 (the rest of the stream is of
    the embedding's size)."""
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[token_id, 0] = logit


def tiny_model_dir(path, num_layers: int = 2, hidden_size: int = 64, seed: int = 0, vocab_size: int = 320,
                   seed_text: str = "", max_positions: int = 512, arch: str = "llama",
                   thinking: bool = False) -> Path:
    """``thinking``: a reasoning model's tokenizer and template (``tiny_tokenizer``), writing
    ``</think>`` at about one position in ten (THINK_END_LOGIT). vLLM's CPU attention runs
    64-wide heads: ``hidden_size=256``."""
    path = Path(path)
    tok = tiny_tokenizer(vocab_size, seed_text, thinking)
    model = tiny_model(tok, num_layers, hidden_size, seed, max_positions, arch,
                       think_end_logit=THINK_END_LOGIT if thinking else None)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_eagle3_head(path: Path, target_dir: Path, layout: str = "plain",
                      architecture: str = "Eagle3LlamaForCausalLM", speculators_type: str = "eagle3") -> Path:
    """A random EAGLE-3 head for the target in ``target_dir`` (a Llama, Qwen2 or Qwen3) as
    vLLM's Eagle3LlamaForCausalLM loads it: one Llama decoder layer over (embedding, state),
    as published heads have for every one of those families, the state fused by ``fc`` from
    the target's states after its embedding and each of its two layers (named in
    ``eagle_aux_hidden_state_layer_ids``: vLLM's default reads layers a two-layer target
    lacks), a final norm and an LM head over the target's vocabulary. ``layout`` "plain": a
    config.json naming ``architecture``; "speculators": vLLM's speculators format (the layer's
    config in ``transformer_layer_config``, ``speculators_config`` naming the verifier)."""
    import transformers
    from safetensors.torch import save_file

    target = json.loads((Path(target_dir) / "config.json").read_text())
    hidden, heads, kv = target["hidden_size"], target["num_attention_heads"], target["num_key_value_heads"]
    head_dim, inner, vocab = hidden // heads, target["intermediate_size"], target["vocab_size"]
    torch.manual_seed(0)
    random = lambda *shape: torch.randn(*shape) * 0.02  # noqa: E731
    layer = "midlayer."
    weights = {f"{layer}self_attn.q_proj.weight": random(heads * head_dim, 2 * hidden),
               f"{layer}self_attn.k_proj.weight": random(kv * head_dim, 2 * hidden),
               f"{layer}self_attn.v_proj.weight": random(kv * head_dim, 2 * hidden),
               f"{layer}self_attn.o_proj.weight": random(hidden, heads * head_dim),
               f"{layer}mlp.gate_proj.weight": random(inner, hidden), f"{layer}mlp.up_proj.weight": random(inner, hidden),
               f"{layer}mlp.down_proj.weight": random(hidden, inner),
               **{f"{layer}{norm}.weight": torch.ones(hidden)
                  for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm")},
               "fc.weight": random(hidden, 3 * hidden), "norm.weight": torch.ones(hidden),
               "lm_head.weight": random(vocab, hidden)}
    path = Path(path)
    path.mkdir(parents=True)
    save_file(weights, str(path / "model.safetensors"))
    # the target's shape as a Llama layer's config (a Qwen target's sliding-window fields dropped)
    llama_fields = set(transformers.LlamaConfig().to_dict()) - {"architectures", "transformers_version"}
    layer_config = {**{k: v for k, v in target.items() if k in llama_fields}, "model_type": "llama",
                    "num_hidden_layers": 1}
    head = {"draft_vocab_size": vocab, "target_hidden_size": hidden, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    if layout == "plain":
        config = {**layer_config, **head, "architectures": [architecture]}
    else:
        config = {**head, "architectures": ["Eagle3Speculator"], "speculators_model_type": speculators_type,
                  "transformer_layer_config": {**layer_config, "architectures": ["LlamaForCausalLM"]},
                  "speculators_config": {"algorithm": speculators_type, "default_proposal_method": "greedy",
                                         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                         "verifier": {"name_or_path": str(target_dir),
                                                      "architectures": target["architectures"]}}}
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


# the commit lay_out_hub_cache files a snapshot under unless told another
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def lay_out_hub_cache(hub_cache: Path, repo_id: str, source: Path, commit: str = HUB_COMMIT,
                      refs: tuple[str, ...] = ("main",), names: tuple[str, ...] | None = None) -> Path:
    """``source``'s files (those in ``names``, or all) as the snapshot ``commit`` of ``repo_id``
    in the hub cache ``hub_cache``: content-addressed ``blobs/``, ``snapshots/<commit>/`` of
    relative links to them, and ``refs/<ref>`` files holding the commit (no newline, as the
    hub's client writes them). Returns the snapshot directory."""
    repo = Path(hub_cache) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(source).iterdir()):
        if names is not None and f.name not in names:
            continue
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def hub_cache_env(hub_cache: Path) -> dict[str, str]:
    """The environment that points huggingface_hub (in a child process) at ``hub_cache``, offline."""
    return {"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}


def use_hub_cache(monkeypatch, hub_cache: Path) -> None:
    """Point huggingface_hub at ``hub_cache``, offline, through ``monkeypatch`` (pytest's). It
    reads both variables when imported, so its constants are set beside the environment
    (which child processes read)."""
    from huggingface_hub import constants

    for name, value in hub_cache_env(hub_cache).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


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

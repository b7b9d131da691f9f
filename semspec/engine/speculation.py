"""What vLLM speculates with for ``token_sd``: the draft a spec names, as vLLM's speculative
config (``VLLMEngine.load``) and the draft's identity (docs/draft.md, "Drafts for token_sd").

A draft spec is one of
- a draft head trained here (``embedded:smollm2-135m-head`` or a directory holding
  ``head.json``): vLLM's ``eagle`` method on the exported head (``semspec.engine.head_plugin``),
  for a head trained on a Llama, Qwen2 or Qwen3 target (``HEAD_MODEL_TYPES``: its layers run as
  that family's in vLLM; a head of another family is refused); the embedded head is the
  default draft of the embedded target;
- ``ngram``: vLLM's prompt lookup (drafts by matching the sequence's last tokens earlier in it;
  no model);
- ``suffix``: vLLM's suffix decoding (suffix trees over the prompt and earlier responses; no
  model), where its package, ``arctic_inference``, is installed;
- ``mtp``: the target's own multi-token-prediction layers, where its config declares some;
- a model (a directory, a hub name ``org/name[@revision]``, a GGUF) whose method is read from
  its ``config.json``: a speculators-format head (``speculators_config``; vLLM reads the rest
  of that format itself) drafts with the method its ``speculators_model_type`` names, a head
  whose ``architectures`` start or end with ``Eagle3`` (``Eagle3LlamaForCausalLM``,
  ``LlamaForCausalLMEagle3``) with ``eagle3``, one starting with ``Eagle`` with ``eagle`` (the
  names vLLM's ``EAGLEConfig`` keeps as they are), anything else is a small model of the
  target's tokenizer, vLLM's ``draft_model``;
- ``KIND:MODEL`` (``eagle3:``, ``eagle:``, ``draft_model:``): the method named, for a head whose
  config names a plain architecture (vLLM itself guesses those from "eagle-" / "eagle3" in the
  model's name only). A name contradicting the config is refused.

``draft_problem`` says why a spec cannot draft, from the files alone (no weights loaded, a hub
model's config and tokenizer fetched without its weights), before a job is stored.

On vLLM's CPU build the head (on tiny Llama, Qwen2 and Qwen3 targets:
tests/semspec/engine/test_head_model.py), ngram, draft_model and EAGLE-3 heads in both layouts
decode (tests/semspec/engine/test_token_engine_drafts.py); a published EAGLE (1) head is checked by
vLLM's configuration only, ``mtp`` is untested here (its families are large GPU models), and
``suffix`` needs its package, not installed here.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from semspec.components import EMBEDDED_DRAFT, EMBEDDED_HEAD, TOKEN_DRAFT_KINDS, TOKEN_DRAFT_WORDS, same_tokenizer
# the target families whose heads vLLM runs here (by name: head_plugin imports no vLLM)
from semspec.engine.head_plugin import HEAD_MODEL_TYPES
from semspec.head import HEAD_META, head_sha256, resolve_head
from semspec.models.hf import library_tag
from semspec.models.identity import ModelIdentity, cache_root, derived_sha256
from semspec.models.paths import ModelLoadError
from semspec.models.reduced_vocab import VOCAB_SUBSET_FILE
from semspec.models.specs import DEFAULT_TARGET, EMBEDDED_PREFIX, load_tokenizer, model_source, resolve_spec
from semspec.types import NGRAM_DRAFT

# what a draft head trained here drafts with in vLLM (Draft.kind); vLLM's method is eagle
HEAD = "head"
# vLLM's methods that draft without running a model (a draft pass per drafted token otherwise)
MODEL_FREE_METHODS = ("ngram", "suffix")
# ngram: the longest and shortest suffix looked up earlier in the sequence (vLLM's
# prompt_lookup_max / _min)
NGRAM_LOOKUP = (4, 2)
# suffix decoding's settings, vLLM 0.32.0's defaults written out so that the identity holds them
# whatever a later release defaults to
SUFFIX_SETTINGS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
                   "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}
SUFFIX_PACKAGE = "arctic_inference"
SUFFIX_INSTALL = "pip install arctic-inference==0.1.1"  # as vLLM 0.32.0's own error says
# a speculators-format head's speculators_model_type -> the vLLM method it drafts with here
# (vLLM reads more types -- peagle, dflash, dspark -- which nothing here has run)
SPECULATORS_METHODS = {"eagle3": "eagle3"}
# where vLLM 0.32.0 reads a target's MTP layer count (SpeculativeConfig.hf_config_override):
# these fields, at the top of its config or in text_config / mtp_config
MTP_LAYER_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")
MTP_CONFIG_SECTIONS = ("text_config", "mtp_config")


@dataclass(frozen=True)
class Draft:
    """A draft spec read: what it drafts with (``HEAD``, or vLLM's method) and the model it names
    (None for ngram, suffix and mtp)."""

    kind: str
    model: str | None = None


def draft_spec(draft: str | None, target: str | None = None) -> str | None:
    """The draft vLLM speculates with for ``draft`` on ``target`` (None: the default head on
    the default target, else none)."""
    if draft not in (None, ""):
        return str(draft)
    return EMBEDDED_HEAD if target in (None, DEFAULT_TARGET) else None


def read_draft(spec: str, cache: Path | None = None) -> Draft:
    """What ``spec`` drafts with (module docstring); raises ``ModelLoadError`` for a model that
    cannot be found, ``ValueError`` for a kind that contradicts it."""
    kind, colon, model = spec.partition(":")
    if colon and kind in TOKEN_DRAFT_WORDS:
        raise ValueError(f"{kind} names no model: write {kind!r} alone")
    if colon and kind in TOKEN_DRAFT_KINDS:
        if not model:
            raise ValueError(f"{kind}: names no model (write {kind}:MODEL)")
        found = model_method(model, cache)
        if found not in ("draft_model", kind):  # a plain architecture may be any kind
            raise ValueError(f"{model!r} is an {found} head (its config.json), not {kind}")
        return Draft(kind, model)
    if spec in TOKEN_DRAFT_WORDS:
        return Draft(spec)
    if resolve_head(spec) is not None:
        return Draft(HEAD, spec)
    return Draft(model_method(spec, cache), spec)


def model_method(spec: str, cache: Path | None = None) -> str:
    """The vLLM method the model ``spec`` names drafts with, read from its ``config.json``."""
    if spec.startswith(EMBEDDED_PREFIX):
        # embedded models are plain models (the target, its layer draft): reading one would
        # materialise the layer draft
        return "draft_model"
    config = model_config(spec, cache)
    if "speculators_config" in config:
        kind = config.get("speculators_model_type")
        if kind not in SPECULATORS_METHODS:
            raise ValueError(f"{spec!r} is a speculators-format head of type {kind!r}; token_sd drafts with "
                             f"type {' or '.join(map(repr, SPECULATORS_METHODS))} ones")
        return SPECULATORS_METHODS[kind]
    architectures = config.get("architectures") or []
    if any(a.startswith("Eagle3") or a.endswith("Eagle3") for a in architectures):
        return "eagle3"
    if any(a.startswith("Eagle") for a in architectures):
        return "eagle"
    return "draft_model"


def model_config(spec: str, cache: Path | None = None) -> dict:
    """The ``config.json`` of the model ``spec`` names ({} for a GGUF), without its weights."""
    resolved = resolve_spec(spec, cache_root(cache), with_weights=False)
    return {} if resolved.kind == "gguf" else directory_config(resolved.path)


def draft_problem(draft: str | None, target: str | None = None, cache: Path | None = None) -> str | None:
    """Why vLLM cannot speculate with ``draft`` on ``target``; None when it can. ``cache``: the
    model cache (None: the default)."""
    spec = draft_spec(draft, target)
    if spec in (None, "none"):
        return ("token_sd drafts with a draft head, a small model of the target's tokenizer, an EAGLE or EAGLE-3 "
                f"head, {', '.join(TOKEN_DRAFT_WORDS)}; no draft is configured (SEMJOBS_DRAFT_MODEL; "
                "docs/draft.md, \"Drafts for token_sd\")")
    try:
        found = read_draft(spec, cache)
        problem = KIND_PROBLEMS[found.kind](found, target or DEFAULT_TARGET, cache)
    except (ModelLoadError, OSError, ValueError) as e:  # a model not found, a config unreadable
        return f"token_sd cannot draft with {spec!r}: {e}"
    return None if problem is None else f"token_sd cannot draft with {spec!r}: {problem}"


def _no_problem(draft: Draft, target: str, cache: Path | None) -> None:
    return None


def _weights_problem(draft: Draft, target: str, cache: Path | None) -> str | None:
    """A local model directory without safetensors weights, which vLLM would fail to load
    (engines load safetensors only; a hub snapshot's weights are checked as they are fetched)."""
    resolved = resolve_spec(draft.model, cache_root(cache), with_weights=False)
    if resolved.kind == "gguf" or resolved.commit is not None or any(resolved.path.glob("*.safetensors")):
        return None
    return (f"{resolved.path} holds no *.safetensors weights (engines load safetensors only: a pickled "
            "checkpoint runs code as it loads)")


def _head_problem(draft: Draft, target: str, cache: Path | None) -> str | None:
    kind = json.loads((resolve_head(draft.model) / HEAD_META).read_text())["target"]["signature"].get("model_type")
    if kind in HEAD_MODEL_TYPES:
        return None
    return (f"vLLM runs heads trained here on {', '.join(HEAD_MODEL_TYPES)} targets (this one was trained on "
            f"a {kind} one)")


def _draft_model_problem(draft: Draft, target: str, cache: Path | None) -> str | None:
    if draft.model == EMBEDDED_DRAFT or _has_reduced_vocabulary(draft.model, cache):
        return (f"it is neither a draft head nor a draft_model vLLM can run: it predicts a reduced vocabulary "
                f"({VOCAB_SUBSET_FILE}), which vLLM ignores, and would draft from logits it was never trained on "
                "(it drafts whole steps: semspec, step_judge)")
    mine, theirs = load_tokenizer(draft.model, cache)[0], load_tokenizer(target, cache)[0]
    if not same_tokenizer(mine, theirs):
        return (f"a draft_model must share the target's tokenizer, and {draft.model!r} ({len(mine)} tokens) tokenizes "
                f"otherwise than the target {target!r} ({len(theirs)} tokens): name a model of the target's family")
    return _weights_problem(draft, target, cache)


def _has_reduced_vocabulary(model: str, cache: Path | None) -> bool:
    resolved = resolve_spec(model, cache_root(cache), with_weights=False)
    return resolved.kind == "hf" and (resolved.path / VOCAB_SUBSET_FILE).is_file()


def _mtp_problem(draft: Draft, target: str, cache: Path | None) -> str | None:
    if mtp_layers(model_config(target, cache)) > 0:
        return None
    return (f"mtp drafts with the target's own multi-token-prediction layers, and {target!r} declares none "
            f"({' / '.join(MTP_LAYER_FIELDS)} in its config.json): name another draft")


def mtp_layers(config: dict) -> int:
    """The MTP layers a model's config declares (0: none)."""
    for section in (config, *(config.get(name) or {} for name in MTP_CONFIG_SECTIONS)):
        for field in MTP_LAYER_FIELDS:
            if section.get(field):
                return int(section[field])
    return 0


def _suffix_problem(draft: Draft, target: str, cache: Path | None) -> str | None:
    if suffix_installed():
        return None
    return f"suffix decoding needs the {SUFFIX_PACKAGE} package, which is not installed here: {SUFFIX_INSTALL}"


def suffix_installed() -> bool:
    """Whether vLLM's suffix decoding can run here (looked up, not imported)."""
    return importlib.util.find_spec(SUFFIX_PACKAGE) is not None


# what each kind checks beyond being found; eagle and eagle3 heads read the target's
# tokenizer and embedding, and ngram needs nothing
KIND_PROBLEMS = {HEAD: _head_problem, "draft_model": _draft_model_problem, "eagle": _weights_problem,
                 "eagle3": _weights_problem, "mtp": _mtp_problem, "suffix": _suffix_problem,
                 NGRAM_DRAFT: _no_problem}


def speculative_config(draft: str | None, target: str | None, tokens: int, target_dir: Path, target_sha: str,
                       cache: Path) -> tuple[dict, ModelIdentity]:
    """(vLLM's ``speculative_config`` drafting ``tokens`` per verification with ``draft`` on
    ``target``, the draft's identity). A head trained here is exported under ``cache`` once per
    head and target; a draft model named by hub name or GGUF is resolved there as a target is."""
    problem = draft_problem(draft, target, cache)
    if problem is not None:
        raise ValueError(problem)
    if tokens < 1:
        raise ValueError("draft_tokens must be at least 1")
    spec = draft_spec(draft, target)
    found = read_draft(spec, cache)
    if found.kind == NGRAM_DRAFT:
        longest, shortest = NGRAM_LOOKUP
        config = {"method": "ngram", "num_speculative_tokens": tokens,
                  "prompt_lookup_max": longest, "prompt_lookup_min": shortest}
        return config, ModelIdentity(NGRAM_DRAFT, derived_sha256("vllm-ngram", str(longest), str(shortest)))
    if found.kind == HEAD:
        return _head_config(spec, tokens, target_dir, target_sha, cache)
    if found.kind == "suffix":
        settings = [f"{name}={value}" for name, value in sorted(SUFFIX_SETTINGS.items())]
        return ({"method": "suffix", "num_speculative_tokens": tokens, **SUFFIX_SETTINGS},
                ModelIdentity(spec, derived_sha256("vllm-suffix", *settings)))
    if found.kind == "mtp":  # vLLM loads the target's own layers when no model is named
        return ({"method": "mtp", "num_speculative_tokens": tokens},
                ModelIdentity(spec, derived_sha256("vllm-mtp", target_sha)))
    model_dir, source = model_source(found.model, cache)
    config = {"method": found.kind, "model": os.fspath(model_dir), "num_speculative_tokens": tokens}
    if found.kind == "draft_model" and vocab_size(model_dir) != vocab_size(target_dir):
        # the same tokenizer, its embedding padded to another size (Qwen2.5's 1.5B and 32B): vLLM
        # refuses unequal sizes unless told to map the draft's ids onto the target's, which for
        # one tokenizer maps every token to itself
        config["use_heterogeneous_vocab"] = True
    # vLLM reads the two layouts of a head differently (their defaults differ), so the same
    # weights in each are two drafts
    layout = "speculators" if "speculators_config" in directory_config(model_dir) else "plain"
    # named as given, a hub model by the commit its name resolved to ("eagle3:org/name@<commit>")
    name = spec[:len(spec) - len(found.model)] + source.name
    return config, ModelIdentity(name, derived_sha256(f"vllm-{found.kind}", layout, source.sha256))


def directory_config(model_dir: Path) -> dict:
    """The ``config.json`` of a model directory."""
    return json.loads((Path(model_dir) / "config.json").read_text())


def vocab_size(model_dir: Path) -> int | None:
    """The embedding rows a model directory's config declares."""
    config = directory_config(model_dir)
    return config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")


def _head_config(spec: str, tokens: int, target_dir: Path, target_sha: str, cache: Path) -> tuple[dict, ModelIdentity]:
    from semspec.engine.head_plugin import export_head, register

    head_dir = resolve_head(spec)
    sha = head_sha256(head_dir, target_sha)
    exported = export_head(head_dir, target_dir, Path(cache) / f"vllm-head-{sha[:16]}-{library_tag()}")
    register()
    # sampled, the head drafts its argmax (vLLM's default) and the target keeps a drafted token
    # with its own probability of it: lossless, and seeded, since the draft draws nothing
    # (vLLM's "probabilistic" drafts draw without the request's seed, so a seeded rerun wrote
    # another text; it kept 28% of drafted tokens at T 0.6 against 26% for the argmax, and ran
    # 1.17x ar against 1.21x at batch 1 on 8 GSM8K questions, a 2-core AVX-512 host)
    config = {"method": "eagle", "model": os.fspath(exported), "num_speculative_tokens": tokens}
    return config, ModelIdentity(spec, sha)

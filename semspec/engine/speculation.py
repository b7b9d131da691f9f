"""What vLLM speculates with for ``token_sd``: the draft a spec names, as vLLM's speculative
config (``VLLMEngine.load``).

- a draft head (``embedded:smollm2-135m-head`` or a directory holding ``head.json``): vLLM's
  ``eagle`` method on the exported head (``semspec.engine.head_plugin``); the embedded head is the
  default draft of the embedded target, since it is the one embedded draft vLLM can run;
- ``ngram``: vLLM's prompt lookup (drafts by matching the sequence's last tokens earlier in
  it; no model);
- anything else (the embedded layer draft, which drafts steps for semspec) vLLM does not
  speculate with: ``draft_problem`` says so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from semspec.components import EMBEDDED_HEAD
from semspec.head import HEAD_META, head_sha256, resolve_head
from semspec.models.hf import library_tag
from semspec.models.identity import ModelIdentity, derived_sha256
from semspec.models.specs import DEFAULT_TARGET
from semspec.types import NGRAM_DRAFT

# the targets whose heads semspec.engine.head_model runs: its layers are vLLM's Llama layers (no
# attention bias as Qwen2's, no q/k norms as Qwen3's, which heads trained on those targets have)
HEAD_MODEL_TYPES = ("llama",)
# ngram: the longest and shortest suffix looked up earlier in the sequence (vLLM's
# prompt_lookup_max / _min)
NGRAM_LOOKUP = (4, 2)


def draft_spec(draft: str | None, target: str | None = None) -> str | None:
    """The draft vLLM speculates with for ``draft`` on ``target`` (None: the default head on
    the default target, else none)."""
    if draft not in (None, ""):
        return str(draft)
    return EMBEDDED_HEAD if target in (None, DEFAULT_TARGET) else None


def draft_problem(draft: str | None, target: str | None = None) -> str | None:
    """Why vLLM cannot speculate with ``draft`` on ``target``; None when it can."""
    spec = draft_spec(draft, target)
    if spec == NGRAM_DRAFT:
        return None
    head = resolve_head(spec) if spec is not None else None
    if head is not None:
        kind = json.loads((head / HEAD_META).read_text())["target"]["signature"].get("model_type")
        if kind in HEAD_MODEL_TYPES:
            return None
        return (f"token_sd on vLLM runs heads on {', '.join(HEAD_MODEL_TYPES)} targets ({spec!r} was trained "
                f"on a {kind} one)")
    return (f"token_sd drafts with a draft head (e.g. {EMBEDDED_HEAD}) or {NGRAM_DRAFT!r}; "
            f"{'no draft is configured' if spec is None else repr(spec) + ' is neither'} "
            "(SEMJOBS_DRAFT_MODEL; a draft model drafts whole steps: semspec, step_judge)")


def speculative_config(draft: str | None, target: str | None, tokens: int, target_dir: Path, target_sha: str,
                       cache: Path) -> tuple[dict, ModelIdentity]:
    """(vLLM's ``speculative_config`` drafting ``tokens`` per verification with ``draft`` on
    ``target``, the draft's identity). A head is exported under ``cache`` once per head and
    target."""
    problem = draft_problem(draft, target)
    if problem is not None:
        raise ValueError(problem)
    if tokens < 1:
        raise ValueError("draft_tokens must be at least 1")
    spec = draft_spec(draft, target)
    if spec == NGRAM_DRAFT:
        longest, shortest = NGRAM_LOOKUP
        config = {"method": "ngram", "num_speculative_tokens": tokens,
                  "prompt_lookup_max": longest, "prompt_lookup_min": shortest}
        return config, ModelIdentity(NGRAM_DRAFT, derived_sha256("vllm-ngram", str(longest), str(shortest)))
    from semspec.engine.head_plugin import export_head, register

    head_dir = resolve_head(spec)
    sha = head_sha256(head_dir, target_sha)
    exported = export_head(head_dir, target_dir, Path(cache) / f"vllm-head-{sha[:16]}-{library_tag()}")
    register()
    # sampled, the head drafts its argmax (vLLM's default) and the target keeps a drafted token
    # with its own probability of it: lossless, and seeded, since the draft draws nothing
    # (vLLM's "probabilistic" drafts draw without the request's seed, so a seeded rerun wrote
    # another text; it kept 28% of drafted tokens at T 0.6 against 26% for the argmax, and ran
    # 1.17x ar against 1.21x: docs/benchmarks.md)
    config = {"method": "eagle", "model": os.fspath(exported), "num_speculative_tokens": tokens}
    return config, ModelIdentity(spec, sha)

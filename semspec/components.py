"""Which draft and probes a deployment decodes with: the embedded pair's defaults, and what
each method needs beyond the target. Read by every engine, so that all fill in a spec alike.
"""

from __future__ import annotations

from pathlib import Path

from .head import resolve_head
from .models.specs import DEFAULT_TARGET
from .probes import embedded_probes_available
from .types import NGRAM_DRAFT

EMBEDDED_DRAFT = "embedded:smollm2-135m-draft"
EMBEDDED_HEAD = "embedded:smollm2-135m-head"
# the probes calibrated for each embedded draft on the embedded target (a draft head drafts
# tokens, for token_sd, and has none)
EMBEDDED_PROBES_FOR = {EMBEDDED_DRAFT: "smollm2-135m"}
# token_sd's drafts named by a word alone, which name no model of their own
# (semspec.engine.speculation), as the step methods' refusal describes each
TOKEN_DRAFT_WORDS = {NGRAM_DRAFT: "vLLM's prompt lookup", "suffix": "vLLM's suffix decoding",
                     "mtp": "the target's own multi-token-prediction layers"}
# the vLLM methods a token_sd draft may name before its model ("eagle3:MODEL")
TOKEN_DRAFT_KINDS = ("draft_model", "eagle", "eagle3")


def default_probes(draft: str | None, target: str | None) -> str | None:
    """The shipped probes for an embedded draft on the embedded target, when they are there."""
    name = EMBEDDED_PROBES_FOR.get(str(draft))
    if name is None or target not in (None, DEFAULT_TARGET) or not embedded_probes_available(name):
        return None
    return f"embedded:{name}"


def embedded_draft_available() -> bool:
    """Whether the embedded draft's trained artifact is shipped in this install."""
    try:
        from semspec.models import draft_artifact, embedded_draft
    except ImportError:
        return False
    art = Path(embedded_draft.ARTIFACT_DIR)
    return (art / draft_artifact.WEIGHTS_FILE).is_file() and (art / draft_artifact.META_FILE).is_file()


def default_draft() -> str | None:
    """The embedded target's default step draft: the layer draft when shipped, else none.
    (token_sd's default is the draft head: ``semspec.engine.speculation.draft_spec``.)"""
    return EMBEDDED_DRAFT if embedded_draft_available() else None


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers give the same ids (same vocabulary)."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    return a.get_vocab() == b.get_vocab()


# What each method needs beyond the target.
METHOD_NEEDS = {"ar": (), "token_sd": ("draft",), "step_judge": ("draft",), "semspec": ("draft", "probes")}


def resolve_components(target: str | None, draft: str | None, probes: str | None) -> tuple[str | None, str | None]:
    """The (draft, probes) specs an engine loads for these specs: the embedded target's
    default draft and the probes shipped for it filled in, "none" and "" read as none."""
    if draft is None and target in (None, DEFAULT_TARGET):
        draft = default_draft()
    if draft in (None, "", "none"):
        if probes not in (None, "", "none"):
            raise ValueError("probes were given without a draft model")
        return None, None
    if probes is None:
        probes = default_probes(draft, target)
    return draft, (None if probes in (None, "", "none") else probes)


def draft_model_spec(draft: str | None) -> str | None:
    """The model a draft spec names: itself, or what follows a token_sd kind ("eagle3:MODEL");
    None for the drafts named by a word alone (ngram, suffix, mtp)."""
    if draft is None or draft in TOKEN_DRAFT_WORDS:
        return None
    kind, colon, model = draft.partition(":")
    return model if colon and kind in TOKEN_DRAFT_KINDS else draft


def step_draft_problem(method: str, draft: str | None) -> str | None:
    """Why ``draft`` cannot draft ``method``'s steps: a draft head (which drafts tokens from
    the target's states), ngram, suffix, mtp and a draft named by a vLLM method draft tokens
    inside vLLM's speculation, for token_sd, never a whole step of their own."""
    if method not in ("semspec", "step_judge") or not draft:
        return None
    if draft in TOKEN_DRAFT_WORDS:
        kind = TOKEN_DRAFT_WORDS[draft]
    elif draft_model_spec(draft) != draft:
        kind = f"named for vLLM's {draft.partition(':')[0]!r} method (name a step draft by its model alone)"
    elif resolve_head(draft) is not None:
        kind = "a draft head"
    else:
        return None
    return (f"method {method!r} drafts whole steps with a draft model (e.g. {EMBEDDED_DRAFT}); {draft!r} "
            f"is {kind}, which drafts tokens for token_sd (SEMJOBS_DRAFT_MODEL)")

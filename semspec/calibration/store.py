"""The calibration directory: what `collect` writes and `label` / `train` read.

    DIR/collect.json                 settings and model identities of the collection run
    DIR/traces.jsonl                 one target trace per question (append-only, for resume)
    DIR/prefixes/<qid>__<k>.json     one prefix: question id, prefix text, the samples
                                     (text + source "target"/"draft"), written last
    DIR/prefixes/<qid>__<k>.safetensors  pooled states of every sample under each model:
                                     "target" [S, H_target], "draft" [S, H_draft]
    DIR/labels.json                  written by `label`: judge settings and, per prefix,
                                     cluster ids and the per-source frequency labels

A prefix is complete when its .json exists (the tensors are written before it, both
atomically), so an interrupted `collect` resumes by skipping complete prefixes.
Samples of every source get features under *both* models: the target probe must score the
draft's steps at decoding time, so it is trained on both sources' steps (and likewise the
draft probe).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from semspec.models.identity import identity_sha256

COLLECT_META = "collect.json"
TRACES = "traces.jsonl"
PREFIX_DIR = "prefixes"
LABELS = "labels.json"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(Path(path), (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode())


def with_old_defaults(meta: dict) -> dict:
    """A collect.json read with the settings of collections from before they were recorded:
    greedy traces cut at their first steps, by transformers' forward in float32."""
    return {"prefixes": "first", "trace_temperature": 0.0, "engine": "transformers float32", **meta}


def prefix_key(question_id: str, k: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(question_id))
    return f"{safe}__{k:03d}"


@dataclass
class PrefixRecord:
    key: str
    question_id: str
    k: int  # number of trace steps in the prefix
    prompt: str
    prefix_text: str
    texts: list[str]  # the sampled next steps
    sources: list[str]  # "target" / "draft", one per sample
    features: dict[str, torch.Tensor] = field(default_factory=dict)  # model role -> [S, H]
    extra: dict[str, Any] = field(default_factory=dict)


class CalibrationStore:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.prefix_dir = self.root / PREFIX_DIR

    # ------------------------------------------------------------------ collect side
    def init(self, meta: dict) -> None:
        """Create the directory, or check that resuming uses compatible settings."""
        self.prefix_dir.mkdir(parents=True, exist_ok=True)
        path = self.root / COLLECT_META
        if path.exists():
            old = json.loads(path.read_text())
            keys = ("target", "draft", "layer", "pooling", "samples", "step_delimiter", "prefixes",
                    "trace_temperature", "engine", "chat_template_kwargs")
            old, new = with_old_defaults(old), with_old_defaults(meta)
            diff = {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}
            # The same spec can name new weights (a retrained embedded draft): compare content.
            for role, m in (meta.get("models") or {}).items():
                was = (old.get("models") or {}).get(role, {}).get("identity")
                if was is not None and identity_sha256(was) != identity_sha256(m.get("identity") or ""):
                    diff[f"{role} model"] = (was, m.get("identity"))
            if diff:
                raise ValueError(
                    f"{self.root} holds a collection with other settings {diff}; "
                    "use another directory or the same settings to resume"
                )
        atomic_write_json(path, meta)

    def meta(self) -> dict:
        path = self.root / COLLECT_META
        if not path.exists():
            raise FileNotFoundError(f"{self.root} is not a calibration directory (no {COLLECT_META})")
        return json.loads(path.read_text())

    def has_prefix(self, key: str) -> bool:
        return (self.prefix_dir / f"{key}.json").exists()

    def write_prefix(self, rec: PrefixRecord) -> None:
        from safetensors.torch import save

        tensors = {role: t.detach().float().contiguous().cpu() for role, t in rec.features.items()}
        atomic_write_bytes(self.prefix_dir / f"{rec.key}.safetensors", save(tensors))
        atomic_write_json(
            self.prefix_dir / f"{rec.key}.json",
            {
                "key": rec.key,
                "question_id": rec.question_id,
                "k": rec.k,
                "prompt": rec.prompt,
                "prefix_text": rec.prefix_text,
                "samples": [{"text": t, "source": s} for t, s in zip(rec.texts, rec.sources)],
                **rec.extra,
            },
        )

    def prefix_files(self, key: str) -> tuple[bytes, bytes]:
        """A stored prefix as bytes: (its .json record, its .safetensors features)."""
        return ((self.prefix_dir / f"{key}.json").read_bytes(),
                (self.prefix_dir / f"{key}.safetensors").read_bytes())

    def put_prefix_files(self, key: str, record: bytes, features: bytes) -> None:
        """Store a prefix from those bytes: the tensors first, the .json last, so the prefix
        counts as complete only once both are there."""
        atomic_write_bytes(self.prefix_dir / f"{key}.safetensors", features)
        atomic_write_bytes(self.prefix_dir / f"{key}.json", record)

    def load_traces(self) -> dict[str, list[str]]:
        """Question id -> trace steps, from traces.jsonl (a torn last line is ignored)."""
        out: dict[str, list[str]] = {}
        path = self.root / TRACES
        if not path.exists():
            return out
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            out[str(row["question_id"])] = list(row["steps"])
        return out

    def append_trace(self, question_id: str, steps: list[str], **extra: Any) -> None:
        with open(self.root / TRACES, "a", encoding="utf-8") as f:
            f.write(json.dumps({"question_id": question_id, "steps": steps, **extra}, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    # ------------------------------------------------------------------ read side
    def keys(self) -> list[str]:
        if not self.prefix_dir.exists():
            return []
        return sorted(p.stem for p in self.prefix_dir.glob("*.json"))

    def read_prefix(self, key: str, with_features: bool = True) -> PrefixRecord:
        from safetensors.torch import load_file

        row = json.loads((self.prefix_dir / f"{key}.json").read_text())
        features = load_file(str(self.prefix_dir / f"{key}.safetensors")) if with_features else {}
        known = {"key", "question_id", "k", "prompt", "prefix_text", "samples"}
        return PrefixRecord(
            key=row["key"],
            question_id=str(row["question_id"]),
            k=int(row["k"]),
            prompt=row["prompt"],
            prefix_text=row["prefix_text"],
            texts=[s["text"] for s in row["samples"]],
            sources=[s["source"] for s in row["samples"]],
            features=features,
            extra={k: v for k, v in row.items() if k not in known},
        )

    def write_labels(self, judge: dict, labels: dict[str, dict]) -> None:
        atomic_write_json(self.root / LABELS, {"judge": judge, "prefixes": labels})

    def read_labels(self) -> dict:
        path = self.root / LABELS
        if not path.exists():
            raise FileNotFoundError(f"{self.root} has no {LABELS}; run `semjobs probe label {self.root}` first")
        return json.loads(path.read_text())


# Settings that must agree for collections to be merged: the samples would not be comparable
# otherwise (the seed may differ: shards are disjoint samples of the same process).
MERGE_KEYS = ("target", "draft", "models", "layer", "pooling", "samples", "temperature", "top_p",
              "step_delimiter", "max_step_tokens", "max_trace_tokens", "trace_temperature", "prefixes", "engine",
              "chat_template_kwargs")


def merge_stores(out: str | os.PathLike, sources: list[str | os.PathLike]) -> dict:
    """Merge calibration directories collected in parallel (say, one per machine, each on its
    own slice of the prompts) into OUT. Settings must agree; a prefix or trace present in two
    sources must be identical. Labels are not merged: label OUT afterwards. Re-running with
    more sources adds what is new."""
    if not sources:
        raise ValueError("nothing to merge")
    stores = [CalibrationStore(s) for s in sources]
    metas = [with_old_defaults(s.meta()) for s in stores]
    for store, meta in zip(stores[1:], metas[1:]):
        diff = {k: (metas[0].get(k), meta.get(k)) for k in MERGE_KEYS if metas[0].get(k) != meta.get(k)}
        if diff:
            raise ValueError(f"{store.root} was collected with other settings than {stores[0].root}: {diff}")
    dest = CalibrationStore(out)
    dest.init({**metas[0], "prompts": sum(int(m.get("prompts") or 0) for m in metas),
               "merged_from": [str(s.root) for s in stores]})
    traces = dest.load_traces()
    added = {"traces": 0, "prefixes": 0}
    for store in stores:
        for qid, steps in store.load_traces().items():
            if qid in traces:
                if traces[qid] != steps:
                    raise ValueError(f"question {qid}: {store.root} holds another trace than {dest.root}")
                continue
            dest.append_trace(qid, steps)
            traces[qid] = steps
            added["traces"] += 1
        for key in store.keys():
            record, features = store.prefix_files(key)
            if dest.has_prefix(key):
                if dest.prefix_files(key)[0] != record:
                    raise ValueError(f"prefix {key}: {store.root} holds other samples than {dest.root}")
                continue
            dest.put_prefix_files(key, record, features)
            added["prefixes"] += 1
    return {"questions": len(traces), "prefixes": len(dest.keys()), "added": added}

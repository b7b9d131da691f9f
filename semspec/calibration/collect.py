"""Calibration data: target traces cut into prefixes, N sampled next steps per prefix from
each model, and both models' pooled hidden states over every sampled step.

For each prompt:
1. The target writes a reasoning trace (sampled at T 0.6 by default, as the paper's
   calibration does; greedy with `trace_temperature=0`), one step at a time, with the
   engine's step rule (`semspec.steps.StepDetector`: delimiter, step token cap, EOS).
2. Prefix k = prompt + the trace's first k steps, for k = 0 .. steps-1; past the cap per
   question, k spread evenly over the whole trace (`prefix_positions`).
3. From each prefix, N next steps are sampled from the target and N from the draft
   (temperature 0.6, top-p 0.95 by default), in one batch per model sharing the prefix's
   KV cache.
4. Every sampled step (both sources) is scored by both models: the pooled
   `hidden_states[layer]` over the step's tokens after the prefix
   (`semspec.probes.step_features`, the computation the engine does when decoding).

Prompts are rendered through the target's chat template with ``chat_template_kwargs`` (a
job's, e.g. ``{"enable_thinking": false}``), so probes for a thinking model learn on prompts
rendered as the jobs they serve render theirs.

The models come as a `CalibrationModels`: on vLLM (`semspec.calibration.vllm_models`), the
engines and stored layers decoding serves with, so the probes learn the states they will
read; or transformers' forward (`semspec.calibration.transformers_models`) where vLLM is not
installed.

Everything goes to a `CalibrationStore` directory, one file pair per prefix, so an
interrupted run resumes where it stopped (traces are kept in traces.jsonl). Per-prefix
random seeds derive from (seed, question id, k), so a resumed run samples the same steps
as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol

import torch

from semspec.calibration.store import CalibrationStore, PrefixRecord, prefix_key
from semspec.types import DEFAULT_MAX_STEP_TOKENS, DEFAULT_STEP_DELIMITER

SOURCES = ("target", "draft")


@dataclass
class CollectConfig:
    samples: int = 10  # N next steps per prefix and model
    temperature: float = 0.6
    top_p: float = 0.95
    layer: int = -1  # hidden_states index for both models (negative: from the end)
    draft_layer: int | None = None  # override for the draft
    pooling: str = "mean"
    # Steps must be cut as the engine cuts them when it decodes with these probes.
    step_delimiter: str = DEFAULT_STEP_DELIMITER
    max_step_tokens: int = DEFAULT_MAX_STEP_TOKENS
    max_trace_tokens: int = 320
    max_trace_steps: int = 12  # prefixes per question at most
    # which prefixes when a trace has more steps than max_trace_steps: "spread" evenly over
    # the whole trace, its first step and its last included (the paper's cut at every step,
    # capped); "first", the trace's first steps only (the shipped probes' recipe)
    prefixes: str = "spread"
    max_prefixes: int | None = None  # total cap for the run (complete prefixes count)
    trace_temperature: float = 0.6  # sampled traces, as decoding samples; 0 = greedy
    seed: int = 0
    # passed to the chat template as a job's are (the keys semspec.prompts.TEMPLATE_KWARGS allows)
    chat_template_kwargs: dict | None = None


@dataclass
class SampledStep:
    tokens: list[int]
    text: str
    end: str  # "delimiter", "eos", "cap", "think_end"


class CalibrationModels(Protocol):
    """A target and (unless only the target's half runs) its draft, as calibration uses them.
    Roles are "target" and "draft"; seeds are the run's per-trace / per-prefix ones."""

    engine: str  # what computes samples and states ("vllm 0.32.0 float32"), recorded with them
    roles: tuple[str, ...]  # ("target",) or ("target", "draft")

    def describe(self, role: str) -> dict: ...  # identity, spec, hidden_size, num_layers

    def tokenizer(self, role: str): ...

    def eos(self, role: str) -> set[int]: ...

    def layer(self, role: str, cfg: "CollectConfig") -> int: ...  # the hidden_states index recorded

    def trace(self, prompt_ids: list[int], cfg: "CollectConfig", seed: int) -> list[str]: ...

    # several prefixes at once (a question's), so that an engine batches them
    def sample(self, role: str, prefixes: list[tuple[list[int], int]], cfg: "CollectConfig"
               ) -> list[list["SampledStep"]]: ...  # (prefix ids, seed) -> its N steps

    def features(self, role: str, prefixes: list[tuple[list[int], list[list[int]]]], cfg: "CollectConfig"
                 ) -> list[torch.Tensor]: ...  # (prefix ids, steps' ids) -> pooled states [steps, H]


def _seed_for(seed: int, *parts) -> int:
    h = hashlib.sha256(json.dumps([seed, *[str(p) for p in parts]]).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 62) - 1)


def step_ids(tokenizer, eos: set[int], step: SampledStep | str, own: bool) -> list[int]:
    """Token ids of a step for feature extraction: the sampler's own ids, or the text
    re-tokenized for the other model. An empty step (immediate EOS) is scored as EOS."""
    if own and isinstance(step, SampledStep) and step.tokens:
        return list(step.tokens)
    text = step.text if isinstance(step, SampledStep) else step
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    if not ids:
        ids = [int(tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(eos))]
    return list(ids)


def layer_for(cfg: CollectConfig, role: str) -> int:
    return cfg.draft_layer if role == "draft" and cfg.draft_layer is not None else cfg.layer


def prefix_ids(tokenizer, prompt: str, prefix_text: str, template_kwargs: dict | None = None) -> list[int]:
    """The prompt (its chat template applied, with ``template_kwargs``) and the trace's first
    steps, as token ids."""
    from semspec.prompts import encode_prompt

    ids = encode_prompt(tokenizer, prompt, template_kwargs)
    if prefix_text:
        ids = ids + tokenizer(prefix_text, add_special_tokens=False)["input_ids"]
    return ids


def _sampling_settings(cfg: CollectConfig) -> dict:
    settings = {"samples": cfg.samples, "temperature": cfg.temperature, "top_p": cfg.top_p,
                "step_delimiter": cfg.step_delimiter, "max_step_tokens": cfg.max_step_tokens,
                "seed": cfg.seed}
    if cfg.chat_template_kwargs:  # only when set: memos sampled before the setting existed stay valid
        settings["chat_template_kwargs"] = cfg.chat_template_kwargs
    return settings


@dataclass
class Prefix:
    """A prefix to sample after: the trace's first ``k`` steps, its seed and memo files."""

    key: str
    k: int
    text: str
    seed: int
    memo: dict[str, Path]  # role -> the memo of its sampled steps


def sampled_steps_for(models: CalibrationModels, role: str, prompt: str, prefixes: list[Prefix],
                      cfg: CollectConfig) -> list[list[SampledStep]]:
    """One model's N sampled next steps for each prefix, memoised per prefix (a JSON file keyed
    by the model identity and the sampling settings; the sampling is seeded, so a resumed run
    keeps what it sampled before instead of sampling again)."""
    want = {"model": str(models.describe(role)["identity"]), "settings": _sampling_settings(cfg),
            "engine": models.engine}
    got: list[list[SampledStep] | None] = []
    for p in prefixes:
        row = {}
        if p.memo[role].exists():
            try:
                row = json.loads(p.memo[role].read_text())
            except ValueError:
                pass
        ok = all(row.get(k) == v for k, v in want.items())
        got.append([SampledStep(list(x["tokens"]), x["text"], x["end"]) for x in row["steps"]] if ok else None)
    missing = [i for i, g in enumerate(got) if g is None]
    tok = models.tokenizer(role)
    fresh = models.sample(role, [(prefix_ids(tok, prompt, prefixes[i].text, cfg.chat_template_kwargs),
                                  _seed_for(prefixes[i].seed, role)) for i in missing], cfg) if missing else []
    from semspec.calibration.store import atomic_write_json

    for i, steps in zip(missing, fresh):
        got[i] = steps
        prefixes[i].memo[role].parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(prefixes[i].memo[role], {**want, "steps": [
            {"tokens": s.tokens, "text": s.text, "end": s.end} for s in steps]})
    return got


def collect_prefixes(models: CalibrationModels, prompt: str, prefixes: list[Prefix], cfg: CollectConfig):
    """Sample N steps per model after each prefix and score all of them with both models.
    Returns per prefix (texts, sources, features {role: [2N, H]})."""
    samples: list[list[SampledStep]] = [[] for _ in prefixes]
    sources: list[list[str]] = [[] for _ in prefixes]
    for role in SOURCES:
        for i, got in enumerate(sampled_steps_for(models, role, prompt, prefixes, cfg)):
            samples[i] += got
            sources[i] += [role] * len(got)
    features: list[dict] = [{} for _ in prefixes]
    for role in SOURCES:
        tok, eos = models.tokenizer(role), models.eos(role)
        requests = [(prefix_ids(tok, prompt, p.text, cfg.chat_template_kwargs),
                     [step_ids(tok, eos, s, own=(src == role)) for s, src in zip(samples[i], sources[i])])
                    for i, p in enumerate(prefixes)]
        for i, pooled in enumerate(models.features(role, requests, cfg)):
            features[i][role] = pooled
    return [([s.text for s in samples[i]], sources[i], features[i]) for i in range(len(prefixes))]


def prefix_positions(n_steps: int, cap: int, how: str = "spread") -> list[int]:
    """The prefix lengths (in trace steps) to sample after, at most `cap` of the trace's
    `n_steps`: all of them when they fit, else the first `cap` ("first") or `cap` spread
    evenly from the first to the last ("spread")."""
    if how not in ("spread", "first"):
        raise ValueError(f"prefixes must be 'spread' or 'first', not {how!r}")
    if n_steps <= cap or how == "first":
        return list(range(min(n_steps, cap)))
    if cap <= 1:
        return [0][:cap]
    return sorted({round(i * (n_steps - 1) / (cap - 1)) for i in range(cap)})


def read_prompts(path: str | Path, skip: int = 0, limit: int | None = None) -> list[tuple[str, str]]:
    """(id, prompt) pairs from a JSONL file: {"id","prompt"}, GSM8K {"question",...}, or the
    OpenAI Batch line format (the last user message). Lines without an id get "line<N>"."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if n < skip or not line.strip():
                continue
            row = json.loads(line)
            if "prompt" in row:
                prompt = row["prompt"]
            elif "question" in row:
                prompt = row["question"]
            elif "body" in row and "messages" in row["body"]:
                users = [m for m in row["body"]["messages"] if m.get("role") == "user"]
                prompt = users[-1]["content"] if users else ""
            else:
                raise ValueError(f"{path}:{n + 1}: no 'prompt', 'question' or Batch 'body.messages'")
            qid = str(row.get("id") or row.get("custom_id") or f"line{n}")
            out.append((qid, prompt))
            if limit is not None and len(out) >= limit:
                break
    return out


def collect(
    models: CalibrationModels,  # target only: only traces and its samples (memoised for a later full run)
    prompts: Iterable[tuple[str, str]],
    out_dir: str | Path,
    cfg: CollectConfig | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Collect calibration data for the pair `models` into `out_dir`.

    Resumable: finished prefixes and traces are skipped. Returns counts and seconds.
    With the target alone it only writes the traces and memoises the target's samples, so
    that this half of the work can run before the draft exists; a later run with the draft
    completes the prefixes from the memo."""
    cfg = cfg or CollectConfig()
    if cfg.samples < 1:
        raise ValueError("samples must be at least 1")
    prompts = list(prompts)
    store = CalibrationStore(out_dir)
    target_only = models.roles == ("target",)
    if target_only:
        store.prefix_dir.mkdir(parents=True, exist_ok=True)
    else:
        described = {r: models.describe(r) for r in SOURCES}
        store.init({
            "target": described["target"]["spec"] or str(described["target"]["identity"]),
            "draft": described["draft"]["spec"] or str(described["draft"]["identity"]),
            "models": described,
            "layer": {r: models.layer(r, cfg) for r in SOURCES},
            "engine": models.engine,
            "pooling": cfg.pooling,
            "samples": cfg.samples,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "step_delimiter": cfg.step_delimiter,
            "max_step_tokens": cfg.max_step_tokens,
            "max_trace_tokens": cfg.max_trace_tokens,
            "trace_temperature": cfg.trace_temperature,
            "prefixes": cfg.prefixes,
            "seed": cfg.seed,
            "chat_template_kwargs": cfg.chat_template_kwargs or None,
            "prompts": len(prompts),
        })
    traces = store.load_traces()
    done = set(store.keys())
    if target_only:
        done = set()  # nothing is complete without the draft; the memo makes repeats cheap
    stats = {"prefixes_new": 0, "prefixes_done_before": len(done), "traces_new": 0, "samples_new": 0}
    cap = cfg.max_prefixes
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cap, initial=min(len(done), cap) if cap else len(done), desc="prefixes", unit="prefix")
    t0 = time.time()
    try:
        for qid, prompt in prompts:
            if cap is not None and len(done) >= cap:
                break
            if qid not in traces:
                from semspec.prompts import encode_prompt

                steps = models.trace(encode_prompt(models.tokenizer("target"), prompt, cfg.chat_template_kwargs),
                                     cfg, _seed_for(cfg.seed, "trace", qid))
                store.append_trace(qid, steps)
                traces[qid] = steps
                stats["traces_new"] += 1
            steps = traces[qid]
            room = None if cap is None else cap - len(done)
            pending = [Prefix(key, k, "".join(steps[:k]), _seed_for(cfg.seed, "prefix", qid, k),
                              {r: store.root / "samples" / f"{r}__{key}.json" for r in SOURCES})
                       for k in prefix_positions(len(steps), cfg.max_trace_steps, cfg.prefixes)
                       if (key := prefix_key(qid, k)) not in done][:room]
            if not pending:
                continue
            if target_only:
                sampled_steps_for(models, "target", prompt, pending, cfg)
                collected = [None] * len(pending)
            else:
                collected = collect_prefixes(models, prompt, pending, cfg)
            for p, got in zip(pending, collected):
                if got is not None:
                    texts, sources, feats = got
                    store.write_prefix(PrefixRecord(
                        key=p.key, question_id=qid, k=p.k, prompt=prompt, prefix_text=p.text,
                        texts=texts, sources=sources, features=feats,
                        extra={"trace_next_step": steps[p.k]},
                    ))
                    stats["samples_new"] += len(texts)
                    if log is not None:
                        log(f"{p.key}: {len(texts)} samples")
                done.add(p.key)
                stats["prefixes_new"] += 1
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    stats["prefixes_total"] = len(done)
    stats["seconds"] = round(time.time() - t0, 1)
    return stats

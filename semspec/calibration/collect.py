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
from typing import Callable, Iterable, Sequence

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


@dataclass
class SampledStep:
    tokens: list[int]
    text: str
    end: str  # "delimiter", "eos", "cap", "think_end"


def _seed_for(seed: int, *parts) -> int:
    h = hashlib.sha256(json.dumps([seed, *[str(p) for p in parts]]).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 62) - 1)


@torch.inference_mode()
def sample_steps(
    loaded,
    prefix_ids: Sequence[int],
    n: int,
    temperature: float,
    top_p: float,
    delimiter: str = "\n\n",
    max_step_tokens: int = 48,
    generator: torch.Generator | None = None,
    target=None,
) -> list[SampledStep]:
    """N next steps after `prefix_ids`, sampled in one batch that shares the prefix cache.

    A step ends as in the engine (`StepDetector`: the delimiter after some non-blank text,
    the end-of-thinking marker, the token cap) or at EOS (not included in the step). A draft
    head (`semspec.head`) samples through `semspec.calibration.head_steps`, reading the
    states of `target` (which it needs) over the prefix, as it does in the engine."""
    from semspec.head import is_head

    if not prefix_ids:
        raise ValueError("sample_steps needs a non-empty prefix")
    if is_head(loaded):
        from semspec.calibration.head_steps import HeadStepper

        stepper = HeadStepper(loaded, target, prefix_ids, n)
        first, advance = stepper.logits, stepper.advance
    else:
        first, advance = _cache_stepper(loaded, prefix_ids, n)
    max_ctx = loaded.max_context
    room = None if max_ctx is None else max_ctx - len(prefix_ids)
    return _sample_loop(loaded, first, advance, n, temperature, top_p, delimiter, max_step_tokens, room, generator)


def _cache_stepper(loaded, prefix_ids, n):
    """(logits after the prefix [n, V], advance) over a transformers cache copied n times."""
    from transformers import DynamicCache

    dev = loaded.device
    cache = DynamicCache(config=loaded.model.config)
    # next_token_logits: a reduced-vocabulary draft samples here as it does in the engine
    logits = loaded.next_token_logits(torch.tensor([list(prefix_ids)], device=dev), cache).repeat(n, 1)
    if n > 1:
        cache.batch_repeat_interleave(n)
    tok = loaded.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(loaded.eos_token_ids), 0)

    def advance(feed: dict[int, int]) -> torch.Tensor:
        ids = [feed.get(i, pad) for i in range(n)]  # every row steps; ended ones on padding
        return loaded.next_token_logits(torch.tensor(ids, device=dev).unsqueeze(1), cache)

    return logits, advance


def _sample_loop(loaded, logits, advance, n, temperature, top_p, delimiter, max_step_tokens, room, generator):
    from semspec.sampling import probs_from_logits
    from semspec.steps import StepDetector, detect_think_end

    tok = loaded.tokenizer
    detector = StepDetector(delimiter, detect_think_end(tok), max_step_tokens)
    eos = loaded.eos_token_ids
    toks: list[list[int]] = [[] for _ in range(n)]
    texts = [""] * n
    ends: list[str | None] = [None] * n
    for step in range(max_step_tokens):
        if room is not None and step >= room:
            for i in range(n):
                ends[i] = ends[i] or "length"
            break
        probs = probs_from_logits(logits, temperature, top_p)
        if temperature <= 0:
            nxt = probs.argmax(-1)
        else:
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        feed = {}
        for i in range(n):
            t = int(nxt[i])
            if ends[i] is None:
                if t in eos:
                    ends[i] = "eos"
                else:
                    toks[i].append(t)
                    prev = len(texts[i])
                    texts[i] = tok.decode(toks[i], skip_special_tokens=False)
                    e = detector.ended(texts[i], len(toks[i]), prev)
                    if e is not None:
                        ends[i] = e.reason
            if ends[i] is None:
                feed[i] = t
        if not feed:
            break
        logits = advance(feed)
    return [SampledStep(t, s, e or "cap") for t, s, e in zip(toks, texts, ends)]


def generate_trace(loaded, prompt: str, cfg: CollectConfig, generator: torch.Generator | None = None) -> list[str]:
    """The target's reasoning trace for `prompt`, as a list of step texts (each keeping its
    delimiter), one step per call of `sample_steps` with batch size 1."""
    from semspec.models import encode_prompt

    tok = loaded.tokenizer
    ids = encode_prompt(tok, prompt)
    steps: list[str] = []
    used = 0
    while used < cfg.max_trace_tokens and len(steps) < cfg.max_trace_steps:
        (s,) = sample_steps(
            loaded, ids, 1, cfg.trace_temperature, cfg.top_p, cfg.step_delimiter,
            min(cfg.max_step_tokens, cfg.max_trace_tokens - used), generator,
        )
        if s.tokens:
            steps.append(s.text)
            ids = ids + s.tokens
            used += len(s.tokens)
        if s.end in ("eos", "length") or not s.tokens:
            break
    return steps


def _step_ids(loaded, step: SampledStep | str, own: bool) -> list[int]:
    """Token ids of a step for feature extraction: the sampler's own ids, or the text
    re-tokenized for the other model. An empty step (immediate EOS) is scored as EOS."""
    if own and isinstance(step, SampledStep) and step.tokens:
        return list(step.tokens)
    text = step.text if isinstance(step, SampledStep) else step
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    if not ids:
        eos = loaded.tokenizer.eos_token_id
        ids = [int(eos if eos is not None else next(iter(loaded.eos_token_ids)))]
    return list(ids)


def _layer_for(cfg: CollectConfig, role: str) -> int:
    return cfg.draft_layer if role == "draft" and cfg.draft_layer is not None else cfg.layer


def _prefix_ids(lm, prompt: str, prefix_text: str) -> list[int]:
    from semspec.models import encode_prompt

    ids = encode_prompt(lm.tokenizer, prompt)
    if prefix_text:
        ids = ids + lm.tokenizer(prefix_text, add_special_tokens=False)["input_ids"]
    return ids


def _sampling_settings(cfg: CollectConfig) -> dict:
    return {"samples": cfg.samples, "temperature": cfg.temperature, "top_p": cfg.top_p,
            "step_delimiter": cfg.step_delimiter, "max_step_tokens": cfg.max_step_tokens,
            "seed": cfg.seed}


def sampled_steps_for(lm, role: str, prompt: str, prefix_text: str, cfg: CollectConfig, seed: int,
                      cache_path: Path | None = None, target=None) -> list[SampledStep]:
    """One model's N sampled next steps for a prefix, memoised in `cache_path` (a JSON file
    keyed by the model identity and the sampling settings; the sampling is seeded, so the
    memo holds exactly what sampling again would give)."""
    want = {"model": str(lm.identity), "settings": _sampling_settings(cfg)}
    if cache_path is not None and cache_path.exists():
        try:
            row = json.loads(cache_path.read_text())
        except ValueError:
            row = {}
        if all(row.get(k) == v for k, v in want.items()):
            return [SampledStep(list(x["tokens"]), x["text"], x["end"]) for x in row["steps"]]
    g = torch.Generator(device=lm.device)
    g.manual_seed(_seed_for(seed, role))
    got = sample_steps(lm, _prefix_ids(lm, prompt, prefix_text), cfg.samples, cfg.temperature,
                       cfg.top_p, cfg.step_delimiter, cfg.max_step_tokens, g, target=target)
    if cache_path is not None:
        from semspec.calibration.store import atomic_write_json

        cache_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cache_path, {**want, "steps": [
            {"tokens": s.tokens, "text": s.text, "end": s.end} for s in got]})
    return got


def collect_prefix(models: dict, prompt: str, prefix_text: str, cfg: CollectConfig, seed: int,
                   cache_paths: dict | None = None):
    """Sample N steps per model after `prefix_text` and score all of them with both models.
    Returns (texts, sources, features {role: [2N, H]})."""
    from semspec.head import is_head
    from semspec.probes import step_features

    prefix_ids = {role: _prefix_ids(lm, prompt, prefix_text) for role, lm in models.items()}
    samples: list[SampledStep] = []
    sources: list[str] = []
    for role in SOURCES:
        got = sampled_steps_for(models[role], role, prompt, prefix_text, cfg, seed,
                                (cache_paths or {}).get(role), target=models["target"])
        samples.extend(got)
        sources.extend([role] * len(got))
    features = {}
    for role in SOURCES:
        lm = models[role]
        steps = [_step_ids(lm, s, own=(src == role)) for s, src in zip(samples, sources)]
        if is_head(lm):  # the head's own states while it reads each step, as when it drafts
            from semspec.calibration.head_steps import head_step_features

            features[role] = head_step_features(lm, models["target"], prefix_ids[role], steps, cfg.pooling)
        else:
            features[role] = step_features(lm, prefix_ids[role], steps, _layer_for(cfg, role), cfg.pooling)
    return [s.text for s in samples], sources, features


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
    target,
    draft,  # None: only traces and the target's samples (memoised for a later full run)
    prompts: Iterable[tuple[str, str]],
    out_dir: str | Path,
    cfg: CollectConfig | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Collect calibration data for (target, draft) — two `LoadedModel`s — into `out_dir`.

    Resumable: finished prefixes and traces are skipped. Returns counts and seconds.
    With `draft=None` it only writes the traces and memoises the target's samples, so that
    this half of the work can run before the draft exists; a later run with the draft
    completes the prefixes from the memo."""
    from semspec.head import is_head

    cfg = cfg or CollectConfig()
    if cfg.samples < 1:
        raise ValueError("samples must be at least 1")
    prompts = list(prompts)
    store = CalibrationStore(out_dir)
    models = {"target": target, "draft": draft}
    target_only = draft is None
    if target_only:
        store.prefix_dir.mkdir(parents=True, exist_ok=True)
    else:
        store.init({
            "target": target.spec or str(target.identity),
            "draft": draft.spec or str(draft.identity),
            "models": {r: {"identity": str(m.identity), "spec": m.spec, "hidden_size": m.hidden_size,
                           "num_layers": m.num_layers} for r, m in models.items()},
            # a head's probe reads its output states (what it predicts), whatever --layer says
            "layer": {r: -1 if is_head(m) else _layer_for(cfg, r) for r, m in models.items()},
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
                g = torch.Generator(device=target.device)
                g.manual_seed(_seed_for(cfg.seed, "trace", qid))
                steps = generate_trace(target, prompt, cfg, g)
                store.append_trace(qid, steps)
                traces[qid] = steps
                stats["traces_new"] += 1
            steps = traces[qid]
            for k in prefix_positions(len(steps), cfg.max_trace_steps, cfg.prefixes):
                if cap is not None and len(done) >= cap:
                    break
                key = prefix_key(qid, k)
                if key in done:
                    continue
                prefix_text = "".join(steps[:k])
                seed = _seed_for(cfg.seed, "prefix", qid, k)
                cache = {r: store.root / "samples" / f"{r}__{key}.json" for r in SOURCES}
                if target_only:
                    sampled_steps_for(target, "target", prompt, prefix_text, cfg, seed, cache["target"])
                    done.add(key)
                    stats["prefixes_new"] += 1
                    if bar is not None:
                        bar.update(1)
                    continue
                texts, sources, feats = collect_prefix(models, prompt, prefix_text, cfg, seed, cache)
                store.write_prefix(PrefixRecord(
                    key=key, question_id=qid, k=k, prompt=prompt, prefix_text=prefix_text,
                    texts=texts, sources=sources, features=feats,
                    extra={"trace_next_step": steps[k]},
                ))
                done.add(key)
                stats["prefixes_new"] += 1
                stats["samples_new"] += len(texts)
                if bar is not None:
                    bar.update(1)
                if log is not None:
                    log(f"{key}: {len(texts)} samples")
    finally:
        if bar is not None:
            bar.close()
    stats["prefixes_total"] = len(done)
    stats["seconds"] = round(time.time() - t0, 1)
    return stats

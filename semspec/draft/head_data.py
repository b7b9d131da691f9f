"""Training data for a draft head: traces the target writes itself, and its states over them.

Traces: questions after the benchmark slice, answered by the target decoded by vLLM
(``semspec.engine.token_engine.VLLMEngine.generate_many``, method ``ar``), greedily and at the bench's
sampling; cached answer by answer, so an interrupted run resumes where it stopped. Each trace knows its
question, so held-out questions keep every answer out of training.

States: one float32 pass of the target over every trace records its final-norm state at every
position -- what its LM head reads, and what the head learns to predict. Stored as float16
(half the memory; the head is trained in float32 on them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from semspec.draft.data import load_questions
from semspec.prompts import encode_prompt
from semspec.types import GenerationConfig, Request

Log = Callable[[str], None]


@dataclass
class Trace:
    ids: list[int]  # prompt + response token ids
    prompt_len: int
    kind: str  # "greedy", "sampled" (the target's own answers) or "reference" (a reference solution)
    question: int = 0  # which question (index after the holdout): a question's traces are held out together


def _cache_key(identity: str, settings: dict, questions: list[str]) -> str:
    h = hashlib.sha256(json.dumps([identity, settings, questions], sort_keys=True).encode())
    return h.hexdigest()[:16]


def generate_traces(engine, questions: list[str], config: GenerationConfig, kind: str, batch_size: int,
                    seed: int, cache_dir: str | None = None, log: Log | None = None) -> list[Trace]:
    """The target's answers to ``questions`` under ``config``, ``batch_size`` decoding at once
    (continuous batching). Question i gets seed ``seed + i``, so a sample does not depend on
    what it was batched with. With ``cache_dir`` each answer is appended to a cache file (one
    per target and settings, keyed by question and seed) as it finishes: a rerun decodes only
    what is missing, whether it was interrupted or asks for more or fewer questions.
    ``engine``: a ``VLLMEngine`` on the target; its answers are cached per engine and
    number type, since another one samples (and may round) otherwise."""
    tok = engine.tokenizer
    eos = tok.eos_token_id
    settings = {"kind": kind, "temperature": config.temperature, "top_p": config.top_p,
                "max_new_tokens": config.max_new_tokens, "dtype": engine.dtype,
                "engine": engine.identities["engine"]}
    known: dict[tuple[str, int], Trace] = {}
    path = None
    if cache_dir:
        path = Path(cache_dir) / f"traces-{_cache_key(str(engine.identity), settings, [])}.jsonl"
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    r = json.loads(line)
                except ValueError:  # a line cut short by a kill: that answer is redone
                    continue
                known[(r["question"], r["seed"])] = Trace(r["ids"], r["prompt_len"], kind)
        path.parent.mkdir(parents=True, exist_ok=True)
    out: dict[int, Trace] = {i: known[(q, seed + i)] for i, q in enumerate(questions) if (q, seed + i) in known}
    todo = [Request(q, dataclasses.replace(config, seed=seed + i), key=i)
            for i, q in enumerate(questions) if i not in out]
    sink = open(path, "a") if path is not None and todo else None
    if sink is not None and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
        sink.write("\n")  # end a line cut short by a kill, so the next answer starts a line of its own
    try:
        for done in engine.generate_many(todo, batch_size=batch_size):
            if done.error is not None:
                raise done.error
            prompt = encode_prompt(tok, questions[done.key])
            resp = tok(done.result.text, add_special_tokens=False)["input_ids"]
            if done.result.finish_reason == "eos" and eos is not None:
                resp.append(eos)
            out[done.key] = Trace(prompt + resp, len(prompt), kind)
            if sink is not None:
                sink.write(json.dumps({"question": questions[done.key], "seed": seed + done.key,
                                       "ids": prompt + resp, "prompt_len": len(prompt)}) + "\n")
                sink.flush()
            if log and len(out) % 32 == 0:
                log(f"{kind} traces {len(out)}/{len(questions)}")
    finally:
        if sink is not None:
            sink.close()
    return [out[i] for i in range(len(questions))]


def build_traces(engine, cfg, cache_dir: str | None = None, log: Log | None = None) -> list[Trace]:
    """Greedy traces for the first ``cfg.greedy_prompts`` questions after the holdout,
    ``cfg.sampled_answers`` sampled ones for each of the first ``cfg.sampled_prompts`` (two
    answers of one question differ where the target is unsure), reference solutions for the
    ``cfg.reference_prompts`` questions after all of them. Every answer has a seed of its own:
    round r of the sampled answers follows round r - 1's seeds, so asking for more answers
    keeps (and reuses from the cache) the ones a smaller build drew."""
    from semspec.draft.data import clean_reference

    rows = load_questions(cfg.data, cfg.holdout)
    n_g, n_s = cfg.greedy_prompts, cfg.sampled_prompts
    answered = max(n_g, n_s)
    need = answered + cfg.reference_prompts
    if len(rows) < need:
        raise ValueError(f"{cfg.data} has {len(rows)} questions after the first {cfg.holdout}; {need} are asked for")
    questions = [r["question"] for r in rows[:need]]
    greedy = GenerationConfig(method="ar", temperature=0.0, max_new_tokens=cfg.max_new_tokens)
    sampled = GenerationConfig(method="ar", temperature=cfg.temperature, top_p=cfg.top_p,
                               max_new_tokens=cfg.max_new_tokens)
    traces = generate_traces(engine, questions[:n_g], greedy, "greedy", cfg.gen_batch_size, cfg.seed, cache_dir, log)
    for i, t in enumerate(traces):
        t.question = i
    for r in range(cfg.sampled_answers):
        more = generate_traces(engine, questions[:n_s], sampled, "sampled", cfg.gen_batch_size,
                               cfg.seed + n_g + r * n_s, cache_dir, log)
        for i, t in enumerate(more):
            t.question = i
        traces += more
    tok = engine.tokenizer
    for q, r in enumerate(rows[answered:need], start=answered):
        prompt = encode_prompt(tok, r["question"])
        resp = tok(clean_reference(r["answer"]), add_special_tokens=False)["input_ids"]
        traces.append(Trace(prompt + resp + ([tok.eos_token_id] if tok.eos_token_id is not None else []),
                            len(prompt), "reference", q))
    return traces


def split_traces(traces: list[Trace], eval_fraction: float) -> tuple[list[int], list[int]]:
    """(train, eval) indices into ``traces``, split by question so no held-out question has an
    answer in training: the last ``eval_fraction`` of the questions with a greedy answer and of
    those answered only at sampling (at least one of each) are held out with all their
    traces; references all train."""
    def answered(kind: str) -> list[int]:
        return sorted({t.question for t in traces if t.kind == kind})

    with_greedy = answered("greedy")
    greedy_set = set(with_greedy)
    groups = [with_greedy, [q for q in answered("sampled") if q not in greedy_set]]
    held_q: set[int] = set()
    for group in groups:
        n = int(round(len(group) * eval_fraction))
        if eval_fraction > 0 and len(group) >= 2:
            n = max(n, 1)  # every kind of question is evaluated
        held_q.update(group[len(group) - n:])
    train = [i for i, t in enumerate(traces) if t.kind == "reference" or t.question not in held_q]
    held = [i for i, t in enumerate(traces) if t.kind != "reference" and t.question in held_q]
    return train, held


def selection_split(held: list[int]) -> tuple[list[int], list[int]]:
    """(selection, report) of the held-out traces: every 4th picks the weights during training,
    the others give the figures reported (all of them, when none are left)."""
    pick = held[::4]
    return pick, [i for i in held if i not in pick] or held


def padded_batches(traces: list[Trace], batch_size: int) -> Iterator[tuple[list[int], torch.Tensor]]:
    """The traces in batches of similar length: (trace indices, their ids [B, width]). Right
    padding: causal attention keeps it out of the real rows."""
    order = sorted(range(len(traces)), key=lambda i: (len(traces[i].ids), i))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        ids = torch.zeros(len(idx), max(len(traces[i].ids) for i in idx), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(traces[i].ids)] = torch.tensor(traces[i].ids)
        yield idx, ids


@torch.inference_mode()
def target_states(target, traces: list[Trace], batch_size: int = 8, log: Log | None = None) -> list[torch.Tensor]:
    """The target's final-norm states [len(ids), H] (float16) over each trace."""
    dec = target.model.get_decoder()
    out: list[torch.Tensor | None] = [None] * len(traces)
    done = 0
    for b, (idx, ids) in enumerate(padded_batches(traces, batch_size)):
        last = dec(input_ids=ids.to(target.device)).last_hidden_state
        for r, i in enumerate(idx):
            out[i] = last[r, : len(traces[i].ids)].to(torch.float16).cpu().clone()
        done += len(idx)
        if log and b % 20 == 0:
            log(f"target states {done}/{len(traces)}")
    return out  # type: ignore[return-value]


def cached_target_states(target, traces: list[Trace], cache_dir: str | None = None, batch_size: int = 8,
                         log: Log | None = None) -> list[torch.Tensor]:
    if not cache_dir:
        return target_states(target, traces, batch_size, log)
    from safetensors.torch import load_file, save_file

    key = _cache_key(str(target.identity), {"states": str(target.dtype)}, [str(t.ids) for t in traces])
    path = Path(cache_dir) / f"states-{key}.safetensors"
    if path.is_file():
        t = load_file(str(path))
        return [t[str(i)] for i in range(len(traces))]
    states = target_states(target, traces, batch_size, log)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({str(i): s.contiguous() for i, s in enumerate(states)}, str(tmp))
    os.replace(tmp, path)
    return states

"""Throughput by batch size (``semjobs bench --batch-size 1,4,8,16,32``).

Every method decodes the same prompts through ``generate_many`` at each batch size on vLLM
(``ar`` on a ``VLLMEngine``, ``token_sd`` on one speculating, ``step_judge`` and ``semspec`` on
a ``VLLMStepEngine``), one engine after the other in one process, so their ratios are
comparable; vLLM runs in ``vllm_dtype``'s number type unless one is forced. Two peers:
``hf_generate``, transformers' own ``generate`` on left-padded static batches of the same
size, in the number type ``pick_dtype`` chooses for the size, each row's output cut at its
own EOS (a static batch still runs until its longest row ends; continuous batching does not
wait); and ``vllm_generate``, plain ``vllm.LLM.generate`` over the same prompt ids, with ar's
engine arguments and at most the batch size in flight: what semjobs on vLLM costs beyond
vLLM itself.

Figures per (batch size, method): generated tokens/s and items/s over the wall time of
the whole set, accuracy against the references, and, when greedy, the share of outputs
identical to the same method's batch-1 outputs (``same_as_batch_1``); for the drafting
methods also what was drafted and kept.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from semspec.answers import final_answer, is_correct
from semspec.models.dtypes import pick_dtype
from semspec.prompts import encode_prompt
from semspec.types import METHODS, GenerationConfig, Request
from semspec.engine.token_engine import vllm_dtype

BATCH_METHODS = ("ar", "token_sd", "step_judge", "semspec", "hf_generate", "vllm_generate")
# What loads to run each method: vLLM's engines by what they serve (ar; token_sd, as vLLM
# speculates for every request of an engine or for none; the step-level methods,
# semspec.engine.step_engine: a target and a draft engine storing the probes' states), the plain vLLM
# peer beside ar's engine (it reads its arguments), and transformers' target for its peer.
KINDS = {"ar": "ar", "vllm_generate": "ar", "token_sd": "token_sd", "step_judge": "steps", "semspec": "steps",
         "hf_generate": "transformers"}


@dataclass
class SweepSettings:
    batch_sizes: tuple[int, ...] = (1, 4, 8, 16, 32)
    methods: tuple[str, ...] = ("ar", "semspec", "hf_generate")
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    dtype: str = "auto"  # "auto": pick_dtype per batch size; else forced for every size
    device: str = "auto"
    draft_max_batch: int | None = None  # None: the engine's (GenerationConfig.draft_max_batch)
    draft_tokens: int = GenerationConfig.draft_tokens  # token_sd
    # vLLM's own engine arguments for the target's engines and the step engines' draft
    # (semspec.engine.engine_args); the plain vLLM peer takes the target's too
    engine_args: dict[str, Any] = field(default_factory=dict)
    draft_engine_args: dict[str, Any] = field(default_factory=dict)


def _config(method: str, s: SweepSettings, i: int) -> GenerationConfig:
    return GenerationConfig(method=method, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                            top_p=s.top_p if s.temperature > 0 else 1.0, seed=s.seed + i,
                            draft_max_batch=s.draft_max_batch, draft_tokens=s.draft_tokens)


def engine_run(engine, method: str, prompts: list[dict], s: SweepSettings, batch_size: int) -> list[dict]:
    """Every prompt through ``generate_many``: one record per prompt, in input order."""
    reqs = [Request(p["prompt"], _config(method, s, i), key=i) for i, p in enumerate(prompts)]
    out: list[dict | None] = [None] * len(prompts)
    for done in engine.generate_many(reqs, batch_size=batch_size):
        if done.error is not None:
            raise RuntimeError(f"{method} failed on prompt {done.key}: {done.error}") from done.error
        r = done.result
        c = r.counters
        out[done.key] = {"text": r.text, "generated_tokens": c.generated_tokens,
                         "steps_drafted": c.steps_drafted, "steps_accepted": c.steps_accepted,
                         "drafted_tokens": c.drafted_tokens, "accepted_tokens": c.accepted_tokens,
                         "phase_seconds": dict(c.phase_seconds)}
    return out


def vllm_generate_run(engine, prompts: list[dict], s: SweepSettings, batch_size: int,
                      device: str = "auto") -> tuple[list[dict], float]:
    """Plain ``vllm.LLM.generate``, compiled (vLLM's default), on ``engine``'s model, number type and KV budget, with
    ``batch_size`` sequences at most in flight, over the prompt ids ``engine`` would decode:
    (records, seconds of the generate call). Its ``LLM`` starts (untimed) in a process of its
    own: vLLM's parallel state is one per process, and freeing a second engine would tear
    down the first's."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from semspec.engine.token_engine import engine_arguments

    kv_bytes = engine.llm.vllm_config.cache_config.kv_cache_memory_bytes  # None: sized by vLLM on a GPU
    # vLLM at its own defaults, compiled graphs included (what `vllm run-batch` runs): the peer
    # a worker's ar is held against
    args = engine_arguments(engine.model_dir, device, engine.dtype, batch_size,
                            None if kv_bytes is None else kv_bytes / 2**30, compile=True, seed=s.seed,
                            user=s.engine_args)
    ids = [encode_prompt(engine.tokenizer, p["prompt"]) for p in prompts]
    sampling = [dict(temperature=s.temperature, top_p=s.top_p if s.temperature > 0 else 1.0,
                     seed=s.seed + i if s.temperature > 0 else None, max_tokens=s.max_new_tokens,
                     stop_token_ids=sorted(engine.eos))
                for i in range(len(prompts))]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        outs, wall = pool.submit(_plain_vllm_generate, args, ids, sampling, torch.get_num_threads()).result()
    recs = []
    for new in outs:
        new = [t for t in new if t not in engine.eos]
        recs.append({"text": engine.tokenizer.decode(new, skip_special_tokens=True), "generated_tokens": len(new)})
    return recs, wall


def _plain_vllm_generate(args: dict, ids: list[list[int]], sampling: list[dict],
                         threads: int) -> tuple[list[list[int]], float]:
    """In a process of its own: ``vllm.LLM(**args).generate`` over ``ids``; (each output's
    token ids, seconds of the generate call)."""
    torch.set_num_threads(threads)
    from vllm import LLM, SamplingParams

    from semspec.engine.token_engine import configure_process

    configure_process()
    llm = LLM(**args)
    params = [SamplingParams(**kw) for kw in sampling]
    llm.generate([{"prompt_token_ids": ids[0]}], SamplingParams(max_tokens=1), use_tqdm=False)  # warm-up, as VLLMEngine.load
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    return [list(o.outputs[0].token_ids) for o in outs], wall


@torch.inference_mode()
def hf_generate_run(target, prompts: list[dict], s: SweepSettings, batch_size: int) -> list[dict]:
    """transformers' ``generate`` on left-padded static batches of ``batch_size``."""
    tok = target.tokenizer
    eos = sorted(target.eos_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    kwargs: dict[str, Any] = dict(max_new_tokens=s.max_new_tokens, eos_token_id=eos, pad_token_id=pad)
    if s.temperature > 0:
        kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    out = []
    for b in range(0, len(prompts), batch_size):
        rows = [encode_prompt(tok, p["prompt"]) for p in prompts[b:b + batch_size]]
        width = max(map(len, rows))
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=target.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=target.device)
        torch.manual_seed(s.seed + b)
        gen = target.model.generate(ids, attention_mask=mask, **kwargs)[:, width:].tolist()
        for new in gen:
            n = next((j for j, t in enumerate(new) if t in target.eos_token_ids), len(new))
            out.append({"text": tok.decode(new[:n], skip_special_tokens=True), "generated_tokens": n})
    return out


def sweep_dtype(kind: str, s: SweepSettings, batch_size: int) -> Any:
    """The number type a ``kind`` of ``KINDS`` runs ``batch_size`` sequences in (``s.dtype``
    when forced)."""
    if kind == "transformers":
        return pick_dtype(s.device, batch_size, s.dtype)
    return vllm_dtype(s.device, s.dtype)


def run_sweep(load: Callable[[Any, str], Any], prompts: list[dict], s: SweepSettings,
              progress: Callable[[str], None] = lambda _m: None,
              loglik: Callable[[str, str], float | None] | None = None) -> dict[str, Any]:
    """``load(dtype, kind)`` gives what runs a ``kind`` of ``KINDS`` in that number type (a
    vLLM engine with ``max(s.batch_sizes)`` slots, or transformers' target). The runs are
    grouped by what they need and each is loaded once and dropped before the next loads.
    ``loglik(prompt, text)``: the target's mean log-likelihood per token of an output,
    reported per run with its gap to ``ar``'s at the same batch size."""
    runs: dict[tuple, list[tuple[int, str]]] = {}  # (dtype, kind) -> (batch size, method)
    for bs in s.batch_sizes:
        for method in s.methods:
            kind = KINDS[method]
            runs.setdefault((sweep_dtype(kind, s, bs), kind), []).append((bs, method))
    by_batch: dict[str, dict[str, dict]] = {str(bs): {} for bs in s.batch_sizes}
    outputs: dict[tuple[int, str], list[str]] = {}
    for (dtype, kind), todo in runs.items():
        try:
            engine = load(dtype, kind)
        except ValueError as e:  # a draft vLLM cannot draft with: the other runs go on
            if kind in ("ar", "transformers"):
                raise
            progress(f"skipped {kind}: {e}")
            continue
        for bs, method in todo:
            problem = engine.method_problem(method) if method in METHODS else None
            if problem:
                progress(f"skipped {method}: {problem}")
                continue
            recs, wall = _timed_run(engine, method, prompts, s, bs)
            outputs[(bs, method)] = [r["text"] for r in recs]
            fig = by_batch[str(bs)][method] = _figures(recs, prompts, wall, dtype, s.draft_tokens)
            fig["engine"] = "transformers" if kind == "transformers" else "vllm"
            progress(f"batch {bs:>3} {method:<16} {fig['tokens_per_s']:7.1f} tok/s "
                     f"{fig['items_per_s']:.3f} items/s ({wall:.1f}s, {fig['dtype']})")
        del engine
        gc.collect()
    # the table reads in the order the methods were asked for
    order = {m: i for i, m in enumerate(s.methods)}
    for bs in by_batch:
        by_batch[bs] = dict(sorted(by_batch[bs].items(), key=lambda kv: order[kv[0]]))
    if s.temperature <= 0 and s.batch_sizes[0] == 1:
        for bs in s.batch_sizes:
            for method in by_batch[str(bs)]:
                ref, got = outputs[(1, method)], outputs[(bs, method)]
                by_batch[str(bs)][method]["same_as_batch_1"] = sum(a == b for a, b in zip(ref, got)) / len(ref)
    if loglik is not None:
        _add_loglik(by_batch, outputs, prompts, loglik)
    if s.temperature <= 0:  # lossless: token_sd's greedy text is ar's
        for bs in s.batch_sizes:
            fig = by_batch[str(bs)].get("token_sd")
            if fig is not None and (bs, "ar") in outputs:
                same = [a == b for a, b in zip(outputs[(bs, "ar")], outputs[(bs, "token_sd")])]
                fig["same_as_ar"] = sum(same) / len(same)
    return {"by_batch_size": by_batch, "goals": goals(by_batch)}


def _timed_run(engine, method: str, prompts: list[dict], s: SweepSettings, batch_size: int) -> tuple[list[dict], float]:
    """(one record per prompt, seconds) of ``method`` at ``batch_size``."""
    if method == "vllm_generate":  # times its generate call alone, not its start
        return vllm_generate_run(engine, prompts, s, batch_size, s.device)
    t0 = time.perf_counter()
    if method == "hf_generate":
        recs = hf_generate_run(engine, prompts, s, batch_size)
    else:
        recs = engine_run(engine, method, prompts, s, batch_size)
    return recs, time.perf_counter() - t0


def _add_loglik(by_batch: dict[str, dict[str, dict]], outputs: dict[tuple[int, str], list[str]],
                prompts: list[dict], loglik: Callable[[str, str], float | None]) -> None:
    """Each run's mean target log-likelihood per token, and ``loglik_gap_vs_ar``: ar's (same
    batch size) minus it: how much less target-like the method's text reads."""
    for (bs, label), texts in outputs.items():
        values = [v for p, t in zip(prompts, texts) if (v := loglik(p["prompt"], t)) is not None]
        by_batch[str(bs)][label]["target_mean_loglik"] = sum(values) / len(values) if values else None
    for row in by_batch.values():
        for label, fig in row.items():
            ar = row.get("ar", {}).get("target_mean_loglik")
            mine = fig.get("target_mean_loglik")
            fig["loglik_gap_vs_ar"] = ar - mine if ar is not None and mine is not None else None


def _figures(recs: list[dict], prompts: list[dict], wall: float, dtype: Any, draft_tokens: int) -> dict[str, Any]:
    gen = sum(r["generated_tokens"] for r in recs)
    refs = [(r, p["reference"]) for r, p in zip(recs, prompts) if p.get("reference") is not None]
    fig: dict[str, Any] = {
        "tokens_per_s": gen / wall, "items_per_s": len(recs) / wall, "wall_s": wall,
        "generated_tokens": gen, "items": len(recs), "dtype": str(dtype).removeprefix("torch."),
        "accuracy": sum(bool(is_correct(final_answer(r["text"]), ref)) for r, ref in refs) / len(refs)
        if refs else None,
    }
    drafted = sum(r.get("steps_drafted", 0) for r in recs)
    if drafted:
        fig["step_acceptance"] = sum(r["steps_accepted"] for r in recs) / drafted
    drafted_tokens = sum(r.get("drafted_tokens", 0) for r in recs)
    if drafted_tokens:
        fig["drafted_tokens"] = drafted_tokens
    if drafted_tokens and not drafted:  # token_sd, which drafts no steps: tokens kept per draft_tokens
        # drafted (per verification, where every verification drafts draft_tokens: a head does,
        # ngram may draft fewer)
        fig["accepted_per_verification"] = sum(r["accepted_tokens"] for r in recs) / drafted_tokens * draft_tokens
    phases: dict[str, float] = {}
    for r in recs:
        for phase, sec in r.get("phase_seconds", {}).items():
            phases[phase] = phases.get(phase, 0.0) + sec
    if phases:  # summed over items: at batch 1 where the wall time went, in a batch overlapping
        fig["phase_seconds"] = phases
    return fig


def goals(by_batch: dict[str, dict[str, dict]]) -> dict[str, float | None]:
    """The issues' ratios, where both sides ran: ar vs hf_generate and vs plain vLLM at 32, ar
    at 16 vs 1, semspec at 8 vs 1, semspec and token_sd vs ar at each size."""
    def tps(bs: int, m: str) -> float | None:
        return by_batch.get(str(bs), {}).get(m, {}).get("tokens_per_s")

    def ratio(a, b):
        return a / b if a is not None and b else None

    out = {
        "ar_b32_over_hf_generate_b32": ratio(tps(32, "ar"), tps(32, "hf_generate")),
        # issue #33: semjobs on vLLM against plain vLLM
        "ar_vllm_b32_over_vllm_generate_b32": ratio(tps(32, "ar"), tps(32, "vllm_generate")),
        "ar_b16_over_ar_b1": ratio(tps(16, "ar"), tps(1, "ar")),
        "semspec_b8_over_semspec_b1": ratio(tps(8, "semspec"), tps(1, "semspec")),
    }
    for bs in by_batch:
        out[f"semspec_over_ar_b{bs}"] = ratio(tps(int(bs), "semspec"), tps(int(bs), "ar"))
        # issue #33: token_sd on vLLM's speculative decoding against ar on vLLM
        out[f"token_sd_vllm_over_ar_vllm_b{bs}"] = ratio(tps(int(bs), "token_sd"), tps(int(bs), "ar"))
    return out


def markdown(result: dict[str, Any]) -> str:
    by_batch = result["by_batch_size"]
    methods = list(next(iter(by_batch.values())))
    lines = ["| batch | " + " | ".join(f"{m} tok/s (items/s)" for m in methods) + " |",
             "|---|" + "---|" * len(methods)]
    for bs, row in by_batch.items():
        cells = [f"{row[m]['tokens_per_s']:.1f} ({row[m]['items_per_s']:.3f})" for m in methods]
        lines.append(f"| {bs} ({row[methods[0]]['dtype']}) | " + " | ".join(cells) + " |")
    lines += ["", "| batch | method | accuracy | same as batch 1 | same as ar | step acceptance | "
              "drafted tokens kept per verification | loglik gap to ar |", "|---|---|---|---|---|---|---|---|"]
    for bs, row in by_batch.items():
        for m, f in row.items():
            def fmt(v):
                return "-" if v is None else f"{v:.2f}"
            lines.append(f"| {bs} | {m} | {fmt(f.get('accuracy'))} | {fmt(f.get('same_as_batch_1'))} | "
                         f"{fmt(f.get('same_as_ar'))} | "
                         f"{fmt(f.get('step_acceptance'))} | {fmt(f.get('accepted_per_verification'))} | "
                         f"{fmt(f.get('loglik_gap_vs_ar'))} |")
    lines += ["", "| goal | ratio |", "|---|---|"]
    lines += [f"| {k} | {'-' if v is None else f'{v:.2f}'} |" for k, v in result["goals"].items()]
    return "\n".join(lines) + "\n"

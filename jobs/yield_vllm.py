"""The yield benchmark's plain-vLLM arm: what a `vllm run-batch` user does with n samples per
prompt, ``vllm.LLM(...).generate`` with ``SamplingParams(n=N, seed=..., ...)``, then filters.

For a fair comparison it runs the model directory, number type and engine arguments
semjobs' own ar engine starts with (``token_engine.engine_arguments``, read from the same
settings as `semjobs run`), on the prompt ids semjobs decodes (``semspec.prompts``), and on
the same processes and threads (``engine_processes.plan``: on a CPU one process per core,
each with a contiguous share of the inputs).

Seeds: input j (0-based, in file order) is sent with seed S + j * N, so vLLM draws its sample i
with seed S + j * N + i and no two samples share one. One seed S for every input would give
sample i of every input seed S + i: the same random draws on every prompt, and on SmolLM2 the
same wrong answer ("10") to most of eight different multiplications.

Timed from the moment every process has loaded its engine (and decoded one token) to the
moment the last one finishes: start-up is not counted, as for the semjobs arms.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class VllmSample:
    input_id: str
    sample: int
    final_answer: str | None  # semspec.answers.final_answer of its text, as semjobs finds it
    finish_reason: str  # "eos" or "length", as semjobs stores it
    tokens: int  # generated, the end-of-sequence token not counted (semjobs' counting)
    # with run(signals=True): semspec.doom's signals, one value per generated token (EOS not counted)
    signals: dict[str, list[float]] | None = None


def target_source():
    """(directory, identity) of the target the current settings name, as `semjobs run` loads it."""
    from semjobs.settings import settings
    from semspec.models.identity import models_cache
    from semspec.models.specs import model_source

    return model_source(settings.target_model, models_cache(settings.cache_dir))


def engine_args(batch_size: int) -> dict:
    """vLLM's engine arguments as `semjobs run` starts its ar engine with the current settings
    (``semjobs.worker.engine.factory_for``, ``VLLMEngine.load``)."""
    from semjobs.settings import settings
    from semspec.engine.token_engine import engine_arguments

    return engine_arguments(target_source()[0], settings.device, settings.dtype, batch_size, settings.kv_cache_gb,
                            compile=bool(settings.vllm_compile), user=settings.target_engine_args)


def run(problems: list[dict], n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int,
        batch_size: int, signals: bool = False) -> tuple[list[VllmSample], float, dict]:
    """Every problem's ``n`` samples: (samples, generation seconds, the engine arguments);
    ``signals``: with each sample's per-token doom signals (``semspec.doom``; it asks vLLM for
    the top log-probabilities of every token)."""
    from semjobs.worker import engine_processes

    args = engine_args(batch_size)
    processes, threads = engine_processes.plan(len(problems) * n)
    processes = min(processes, len(problems))
    sampling = dict(n=n, temperature=temperature, top_p=top_p if temperature > 0 else 1.0, max_tokens=max_new_tokens)
    if signals:
        from semspec.doom import TOP_LOGPROBS

        sampling["logprobs"] = TOP_LOGPROBS
    seeds = [seed + j * n if temperature > 0 else None for j in range(len(problems))]
    size = -(-len(problems) // processes)
    shares = [(problems[i:i + size], seeds[i:i + size]) for i in range(0, len(problems), size)]
    ctx = multiprocessing.get_context("spawn")  # a forked copy of torch's thread pool hangs
    ready, results = ctx.Barrier(len(shares)), ctx.Queue()
    children = [ctx.Process(target=_decode, args=(args, threads, *share, sampling, ready, results), daemon=True)
                for share in shares]
    for child in children:
        child.start()
    got = _collect(results, children, ready)
    failed = [g for g in got if isinstance(g, str)]
    if failed:
        raise RuntimeError(f"plain vLLM failed: {failed[0]}")
    samples = [s for share_samples, _, _ in got for s in share_samples]
    wall = max(end for _, _, end in got) - min(start for _, start, _ in got)
    return samples, wall, args


def _collect(results, children, ready) -> list:
    """One answer per child; read before joining them: a child exits only once its queue is
    drained. A child that dies without answering (killed, crashed) fails the arm."""
    got = []
    while len(got) < len(children):
        try:
            got.append(results.get(timeout=5))
        except queue.Empty:
            codes = [child.exitcode for child in children]
            if any(code not in (None, 0) for code in codes):
                ready.abort()  # the others must not wait at the barrier for a dead one
            if None not in codes:
                got += [f"a vLLM process exited with code {max(codes)} without an answer"] * (len(children) - len(got))
    for child in children:
        child.join()
    return got


def _decode(args: dict, threads: int | None, problems: list[dict], seeds: list[int | None], sampling: dict,
            ready, results) -> None:
    """In a process of its own: load vLLM, wait for the others, decode ``problems`` (each with
    its seed); puts (samples, start, end) on ``results``, or why it failed."""
    try:
        results.put(_generate(args, threads, problems, seeds, sampling, ready))
    except BaseException as e:  # noqa: BLE001 -- the parent waits for every child's answer
        ready.abort()  # the others must not wait for this one
        results.put(f"{type(e).__name__}: {e}")


def _generate(args, threads, problems, seeds, sampling, ready) -> tuple[list[VllmSample], float, float]:
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    from vllm import LLM, SamplingParams

    from semspec.answers import final_answer
    from semspec.engine.token_engine import configure_process, model_files
    from semspec.prompts import prompt_ids
    from semspec.steps import detect_think_end

    configure_process()
    tokenizer, _, eos = model_files(args["model"])
    think_end = detect_think_end(tokenizer)
    llm = LLM(**args)
    context = int(llm.model_config.max_model_len)
    ids = [prompt_ids(tokenizer, p.get("messages") or p["prompt"], p.get("chat_template_kwargs"), context)
           for p in problems]
    params = [SamplingParams(**{**sampling, "max_tokens": min(sampling["max_tokens"], context - len(x))},
                             seed=seed, stop_token_ids=sorted(eos)) for x, seed in zip(ids, seeds)]
    llm.generate([{"prompt_token_ids": ids[0]}], SamplingParams(max_tokens=1), use_tqdm=False)  # as VLLMEngine.load
    ready.wait()
    start = time.time()  # wall clock: compared across processes
    outs = llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
    end = time.time()
    samples = []
    for problem, out in zip(problems, outs):
        for c in out.outputs:
            new = list(c.token_ids)
            if new and new[-1] in eos:
                new = new[:-1]
            text = tokenizer.decode(new, skip_special_tokens=True)
            samples.append(VllmSample(str(problem["id"]), c.index, final_answer(text, think_end),
                                      "eos" if c.finish_reason == "stop" else "length", len(new),
                                      _signals(new, c.logprobs) if c.logprobs is not None else None))
    return samples, start, end


def _signals(ids: list[int], logprobs: list[dict]) -> dict[str, list[float]]:
    """Every doom signal of a sample's tokens (``logprobs``: vLLM's, one dict per token)."""
    from semspec.doom import SIGNALS, token_signal

    return {signal: [token_signal(signal, lp[token].logprob, (p.logprob for p in lp.values()))
                     for token, lp in zip(ids, logprobs)] for signal in SIGNALS}

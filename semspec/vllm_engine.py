"""vLLM under semjobs: the same ``generate_many`` as ``semspec.engine.Engine``, decoded by
vLLM's engine (continuous batching, a paged KV cache within a set budget, prefix caching,
CUDA graphs on a GPU).

    engine = VLLMEngine.load(kv_cache_gb=2)       # the embedded SmolLM2, or any model spec
    for done in engine.generate_many(prompts, GenerationConfig(method="ar"), batch_size=32):
        done.key, done.result, done.error

Prompts are rendered and tokenized here with the target's own chat template (as the embedded
engine does), so both engines read the same prompt ids; vLLM only sees token ids. Results
have the embedded engine's shape: the text's steps are cut after decoding by the same step
rule, each timed by when its tokens came back.

vLLM's synchronous ``LLMEngine`` runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
the caller's loop (``worker.batching``) adds a request the moment a slot frees and gets each
result the step it finishes, which is what an async engine would give it, without a second
process per engine or an event loop inside a Celery thread.

No I/O happens here beyond model loading.
"""

from __future__ import annotations

import bisect
import gc
import importlib.util
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from .answers import final_answer, split_reasoning
from .intake import Intake
from .models import DEFAULT_TARGET, ModelIdentity, cpu_has_fast_bf16, eos_token_ids, model_directory, models_cache
from .sequence import prompt_ids
from .steps import StepDetector, detect_think_end, step_spans
from .types import (DEFAULT_MAX_STEP_TOKENS, DEFAULT_STEP_DELIMITER, METHODS, Abort, Cancelled, Counters, Finished,
                    GenerationConfig, GenerationResult, StepRecord)

# The methods vLLM serves today; the others run on the embedded engine (semspec.engine).
VLLM_METHODS = ("ar",)
# KV cache budget when the caller sets none, in GiB: 32 sequences of SmolLM2's 8,192-token
# context in float32 would need 11 GiB, but a batch's sequences rarely all run long; a
# sequence that does not fit waits (vLLM preempts and recomputes it) rather than failing.
DEFAULT_KV_CACHE_GB = 2.0
# KV block size on a CPU: vLLM's CPU attention wants multiples of 32 and caches only whole
# blocks, so its default (128) would cache no prompt shorter than 128 tokens.
CPU_BLOCK_SIZE = 32


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (looked up, not imported: importing takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_dtype(device: str, dtype: str) -> str:
    """The number type vLLM runs in: ``dtype`` when forced; "auto" is bfloat16 on CUDA and on a
    CPU with bfloat16 instructions (AMX, AVX512-BF16), float32 on other CPUs."""
    if dtype != "auto":
        return dtype
    on_gpu = device != "cpu" and torch.cuda.is_available()
    return "bfloat16" if on_gpu or cpu_has_fast_bf16() else "float32"


def engine_arguments(model_dir: str | os.PathLike, device: str = "auto", dtype: str = "auto", batch_size: int = 32,
                     kv_cache_gb: float = DEFAULT_KV_CACHE_GB, compile: bool = False, seed: int = 0) -> dict:
    """vLLM's engine arguments for semjobs' settings (``VLLMEngine.load``; the bench's plain
    ``vllm.LLM`` peer takes the same)."""
    on_cpu = device == "cpu" or not torch.cuda.is_available()
    return dict(
        model=str(model_dir), tokenizer=str(model_dir), dtype=vllm_dtype("cpu" if on_cpu else "cuda", dtype),
        seed=seed, max_num_seqs=batch_size, enable_prefix_caching=True, enforce_eager=not compile,
        disable_log_stats=True, kv_cache_memory_bytes=int(kv_cache_gb * 2**30),
        block_size=CPU_BLOCK_SIZE if on_cpu else None,
    )


def configure_process() -> None:
    """Environment vLLM reads when an engine starts: the engine in this process (no engine
    core process of its own), and its log at errors only (set VLLM_LOGGING_LEVEL to see
    more): at warning level it prints hundreds of lines per start about choices made here on
    purpose (eager mode, a float32 checkpoint cast to bfloat16 weight by weight, no tcmalloc
    preloaded), and a failure to start is raised anyway."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


@dataclass
class _Running:
    """One request in vLLM: what its result needs."""

    key: Any
    config: GenerationConfig
    prompt_len: int
    t0: float
    ids: list[int] = field(default_factory=list)
    # (generated tokens so far, perf_counter) each time tokens came back: times the steps
    arrivals: list[tuple[int, float]] = field(default_factory=list)
    passes: int = 0


class VLLMEngine:
    def __init__(self, llm: Any, tokenizer: Any, identity: ModelIdentity, dtype: str, max_context: int,
                 eos: set[int], version: str, model_dir: Path, threads: int):
        """``model_dir``: what vLLM loaded; ``threads``: torch's threads in the thread that
        loaded it (see generate_many)."""
        self.llm = llm
        self.tokenizer = tokenizer
        self.identity = identity
        self.dtype = dtype
        self.max_context = max_context
        self.eos = eos
        self.version = version
        self.think_end_marker = detect_think_end(tokenizer)
        self._next_id = 0
        self.model_dir = model_dir
        self.threads = threads

    @classmethod
    def load(cls, target: str | None = None, draft: str | None = None, probes: str | None = None,
             device: str = "auto", cache_dir: str | os.PathLike | None = None, dtype: str = "auto",
             batch_size: int = 32, kv_cache_gb: float = DEFAULT_KV_CACHE_GB, compile: bool = False,
             seed: int = 0) -> "VLLMEngine":
        """Start vLLM on the target spec (``semspec.models``: embedded name, GGUF, directory).
        ``draft`` and ``probes`` are not used yet (``VLLM_METHODS``). ``batch_size``: requests
        decoded at once. ``kv_cache_gb``: the KV cache's whole budget. ``compile``: vLLM's
        compiled graphs (slower start) instead of eager mode."""
        configure_process()
        import vllm
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig as HFGenerationConfig
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        threads = torch.get_num_threads()
        model_dir, sha = model_directory(target, models_cache(cache_dir))
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        try:
            generation_config = HFGenerationConfig.from_pretrained(model_dir, local_files_only=True)
        except OSError:  # the model ships none
            generation_config = None
        args = EngineArgs(**engine_arguments(model_dir, device, dtype, batch_size, kv_cache_gb, compile, seed))
        dt = args.dtype
        # an engine dropped but not yet collected would, when collected, tear down the
        # per-process parallel state this one is about to share
        gc.collect()
        set_num_threads = torch.set_num_threads
        try:
            llm = LLMEngine.from_engine_args(args)
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads with a no-op, for its thread
            # binding; in this process it binds nothing, and the embedded engine, tests and
            # the thread that steps this engine (generate_many) need the real one
            torch.set_num_threads = set_num_threads
        name = str(target) if target is not None else DEFAULT_TARGET
        engine = cls(llm, tokenizer, ModelIdentity(name, sha), dt, int(llm.model_config.max_model_len),
                     eos_token_ids(hf_config, generation_config, tokenizer), vllm.__version__, model_dir, threads)
        # one token now: a model vLLM loads but cannot run (an attention shape its kernels
        # lack) fails the load, before any job is stored, instead of every item
        engine.generate("Hi", GenerationConfig(method="ar", max_new_tokens=1))
        return engine

    # ------------------------------------------------------------------ what it serves
    @property
    def identities(self) -> dict[str, str]:
        """What made an output: the target's identity, the number type and the engine."""
        return {"target": str(self.identity), "dtype": self.dtype, "engine": f"vllm {self.version}"}

    def method_problem(self, method: str) -> str | None:
        if method not in METHODS:
            return f"unknown method {method!r}; one of {', '.join(METHODS)}"
        if method not in VLLM_METHODS:
            return (f"method {method!r} does not run on the vLLM engine yet (it runs "
                    f"{', '.join(VLLM_METHODS)}); use --engine embedded (SEMJOBS_ENGINE=embedded)")
        return None

    # ------------------------------------------------------------------ decoding
    def generate_many(self, prompts: Iterable, config: GenerationConfig | None = None,
                      batch_size: int = 8) -> Iterator[Finished]:
        """Decode up to ``batch_size`` prompts at once, yielding a :class:`Finished` as each
        ends (``semspec.engine.Engine.generate_many``'s contract: ``prompts`` read lazily, one
        as each slot frees; None from a live source means nothing new yet; a bad prompt fails
        alone; an Abort from the source ends that request at once: ``semspec.intake``)."""
        # Torch's thread count is per thread: a thread that steps the engine (the worker's
        # batch loop) must run the count it was loaded with, or vLLM's CPU attention, which
        # plans its work for that count, aborts the process.
        torch.set_num_threads(self.threads)
        default = config or GenerationConfig(method="ar")
        intake = Intake(prompts)
        running: dict[str, _Running] = {}
        try:
            while True:
                # None: nothing new now: go on decoding
                while (req := intake.next(room=len(running) < batch_size)) is not None:
                    if isinstance(req, Abort):
                        rid = next((r for r, run in running.items() if run.key == req.key), None)
                        if rid is not None:  # else it has finished
                            self.llm.abort_request([rid])
                            del running[rid]
                            yield Finished(req.key, None, Cancelled(f"request {req.key!r} aborted"))
                        continue
                    try:
                        self._add(req.key, req.prompt, req.config or default, running)
                    except ValueError as e:  # a bad prompt (PromptError) or config
                        yield Finished(req.key, None, e)
                if not running:
                    if intake.exhausted:
                        return
                    continue
                for out in self.llm.step():
                    run = running.get(out.request_id)
                    if run is None:
                        continue
                    self._take(run, out)
                    if out.finished:
                        del running[out.request_id]
                        yield Finished(run.key, self._result(run, out.outputs[0].finish_reason))
        finally:  # the caller stopped early (or failed): free vLLM of what is left
            if running:
                self.llm.abort_request(list(running))

    def _add(self, key: Any, prompt: Any, config: GenerationConfig, running: dict[str, _Running]) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        problem = self.method_problem(config.method)
        if problem is not None:
            raise ValueError(problem)
        if config.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        ids = prompt_ids(self.tokenizer, prompt, config.chat_template_kwargs, self.max_context)
        params = SamplingParams(
            temperature=config.temperature, top_p=config.top_p if config.temperature > 0 else 1.0,
            seed=config.seed if config.temperature > 0 else None,
            max_tokens=min(config.max_new_tokens, self.max_context - len(ids)),
            stop_token_ids=sorted(self.eos), detokenize=False, output_kind=RequestOutputKind.DELTA,
        )
        request_id = str(self._next_id)
        self._next_id += 1
        running[request_id] = _Running(key, config, len(ids), time.perf_counter())
        self.llm.add_request(request_id, self.llm.renderer.render_cmpl([{"prompt_token_ids": ids}])[0], params)

    @staticmethod
    def _take(run: _Running, out: Any) -> None:
        new = out.outputs[0].token_ids
        if new:
            run.ids.extend(new)
            run.passes += 1
            run.arrivals.append((len(run.ids), time.perf_counter()))

    def _result(self, run: _Running, vllm_reason: str | None) -> GenerationResult:
        ids = run.ids
        finish = "eos" if vllm_reason == "stop" else "length"
        if ids and ids[-1] in self.eos:
            ids = ids[:-1]  # the end-of-sequence token is not part of the text, as in the embedded engine
        cfg = run.config
        think_end = self.think_end_marker if cfg.think_end == "auto" else (cfg.think_end or None)
        detector = StepDetector(cfg.step_delimiter or DEFAULT_STEP_DELIMITER, think_end,
                                cfg.max_step_tokens or DEFAULT_MAX_STEP_TOKENS)
        steps = self._steps(ids, step_spans(self.tokenizer, ids, detector), run)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        reasoning, content = split_reasoning(text, think_end)
        first = run.arrivals[0][1] if run.arrivals else run.t0
        last = run.arrivals[-1][1] if run.arrivals else run.t0
        counters = Counters(prompt_tokens=run.prompt_len, generated_tokens=len(ids),
                            target_forward_passes=run.passes,
                            phase_seconds={"prefill": first - run.t0, "target_write": last - first})
        return GenerationResult(
            text=text, final_answer=final_answer(text, think_end), reasoning=reasoning, content=content,
            steps=steps, counters=counters, wall_seconds=time.perf_counter() - run.t0,
            finish_reason=finish, models=self.identities,
        )

    def _steps(self, ids: list[int], spans: list[tuple[int, int]], run: _Running) -> list[StepRecord]:
        """The step log: the target wrote every step; each step's seconds run from the moment
        its first token came back to its last (the first step's from the request's start)."""
        counts = [count for count, _ in run.arrivals]

        def arrived(n: int) -> float:  # when the n-th generated token came back
            i = min(bisect.bisect_left(counts, n), len(counts) - 1)
            return run.arrivals[i][1] if counts else run.t0

        steps = []
        for index, (start, end) in enumerate(spans):
            began = run.t0 if start == 0 else arrived(start)
            steps.append(StepRecord(
                index=index, author="target", text=self.tokenizer.decode(ids[start:end], skip_special_tokens=False),
                drafted_tokens=0, accepted_tokens=0, decision="target_only", target_tokens=end - start,
                seconds=arrived(end) - began,
            ))
        return steps

    def generate(self, messages: list[dict] | str, config: GenerationConfig | None = None) -> GenerationResult:
        """One prompt; errors are raised."""
        (done,) = self.generate_many([messages], config, batch_size=1)
        if done.error is not None:
            raise done.error
        return done.result

"""vLLM under semjobs for ``ar`` and ``token_sd``: ``generate_many`` over vLLM's engine
(continuous batching, a paged KV cache within a set budget, prefix caching, CUDA graphs on a
GPU). The step-level methods run on ``semspec.engine.step_engine``, with the same contract.

    engine = VLLMEngine.load(kv_cache_gb=2)       # the embedded SmolLM2, or any model spec
    for done in engine.generate_many(prompts, GenerationConfig(method="ar"), batch_size=32):
        done.key, done.result, done.error

Prompts are rendered and tokenized here with the target's own chat template
(``semspec.prompts``), so every engine reads the same prompt ids; vLLM only sees token ids.
Results have the step-level methods' shape: the text's steps are cut after decoding by the
same step rule, each timed by when its tokens came back.

With ``stop_loops`` a request carries ``semspec.repetition``'s rule as vLLM's own repetition
detection (``SamplingParams.repetition_detection``: the same rule, checked in vLLM's scheduler
after every token, so the request ends at the token the rule fires on, drafted tokens past it
dropped); its result is cut where ``semspec.repetition.find_loop`` says.

vLLM's synchronous ``LLMEngine`` runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
the caller's loop (``semjobs.worker.batching``) adds a request the moment a slot frees and gets each
result the step it finishes, which is what an async engine would give it, without a second
process per engine or an event loop inside a Celery thread.

No I/O happens here beyond model loading.
"""

from __future__ import annotations

import bisect
import gc
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from semspec.answers import final_answer, split_reasoning
from semspec.intake import Intake
from semspec.models.dtypes import cpu_has_fast_bf16
from semspec.models.identity import DEFAULT_CACHE_DIR, ModelIdentity, models_cache
from semspec.models.loaded import eos_token_ids
from semspec.models.specs import model_source
from semspec.prompts import prompt_ids
from semspec.doom import DoomRule, DoomWatch, token_signal
from semspec.repetition import DEFAULT_RULE, find_loop, line_break_ids, vllm_detection
from semspec.steps import StepDetector, detect_think_end, step_spans
from semspec.engine.speculation import MODEL_FREE_METHODS, speculative_config
# one check that vLLM is here, for the engines and for the engine arguments (which load no torch)
from semspec.engine.engine_args import vllm_installed  # noqa: F401  (re-exported: worker.tasks, calibration)
from semspec.types import (DEFAULT_MAX_STEP_TOKENS, DEFAULT_STEP_DELIMITER, METHODS, Abort, Cancelled, Counters, Finished,
                    GenerationConfig, GenerationResult, StepRecord)

# The methods this engine serves; semspec.engine.step_engine serves the step-level ones
# (types.VLLM_STEP_METHODS). token_sd is vLLM's own speculative decoding (semspec.engine.speculation).
VLLM_METHODS = ("ar", "token_sd")
# KV cache budget on a CPU when the caller sets none, in GiB: 32 sequences of SmolLM2's 8,192-token
# context in float32 would need 11 GiB, but a batch's sequences rarely all run long; a
# sequence that does not fit waits (vLLM preempts and recomputes it) rather than failing.
DEFAULT_KV_CACHE_GB = 2.0
# KV block size on a CPU: vLLM's CPU attention wants multiples of 32 and caches only whole
# blocks, so its default (128) would cache no prompt shorter than 128 tokens.
CPU_BLOCK_SIZE = 32
# On a CPU a verification of K drafted tokens costs about K + 1 tokens' work per row, so beside
# other rows it no longer comes nearly free: token_sd made 1.4-1.9x ar alone but 0.88x at 4 in
# flight and 0.45x at 32 (T 0.6); at 2 in flight drafting still paid, 1.15x (T 0.6) and 1.58x
# (greedy) against 0.96x / 0.98x without (docs/benchmarks.md, "Defaults chosen by measurement"). An engine there drafts only
# while at most this many requests run, unless told otherwise (draft_max_batch, as the
# step-level methods' drafting; vLLM's num_speculative_tokens_per_batch_size: above it a step
# drafts nothing, and skips the draft's pass and the rejection sampler:
# semspec.engine.vllm_cpu_speculation). On a GPU vLLM speculates at every batch size, as it
# would by itself.
CPU_SPECULATION_MAX_BATCH = 2
# Drafts read from the target's hidden states by a one-layer head. For them vLLM recomputes the
# last cached block of a new request's prompt, so that the head's cache there is rebuilt from
# the target's states; on a CPU that is up to 32 more tokens in every new request's prefill
# (about 35 ms at batch 1 beside a 25 ms step), which the step-level methods' writer pays at
# every step it writes and each of n samples at its prompt. Kept there, a stale entry of the
# head's cache can cost a drafted token or two, never the text (the target verifies them):
# written a request per 20 tokens a greedy answer ran slower with vLLM's recompute than
# without (a one-off measurement; its script is in git history, benchmarks/request_restart.py).
HEAD_METHODS = ("eagle", "eagle3")


def vllm_dtype(device: str, dtype: str) -> str:
    """The number type vLLM runs in: ``dtype`` when forced; "auto" is bfloat16 on CUDA and on a
    CPU with bfloat16 instructions (AMX, AVX512-BF16), float32 on other CPUs."""
    if dtype != "auto":
        return dtype
    on_gpu = device != "cpu" and torch.cuda.is_available()
    return "bfloat16" if on_gpu or cpu_has_fast_bf16() else "float32"


def runs_on_cpu(device: str) -> bool:
    """Whether an engine for ``device`` ("auto", "cpu", "cuda") runs on the CPU."""
    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def kv_budget_gb(kv_cache_gb: float | None, device: str) -> float | None:
    """The KV cache's budget in GiB: the one given, else ``DEFAULT_KV_CACHE_GB`` on a CPU; on a
    GPU none (vLLM sizes the cache from what ``gpu_memory_utilization`` leaves of the GPU)."""
    if kv_cache_gb is not None:
        return kv_cache_gb
    return DEFAULT_KV_CACHE_GB if runs_on_cpu(device) else None


def engine_arguments(model_dir: str | os.PathLike, device: str = "auto", dtype: str = "auto", batch_size: int = 32,
                     kv_cache_gb: float | None = None, compile: bool = False, seed: int = 0,
                     speculative_config: dict | None = None, states_layer: int | None = None,
                     user: dict | None = None, gpu_memory_utilization: float | None = None,
                     draft_max_batch: int | None = None) -> dict:
    """vLLM's engine arguments for semjobs' settings (``VLLMEngine.load``; the bench's plain
    ``vllm.LLM`` peer takes the same). ``states_layer``: an engine that returns that layer's
    hidden states to the requests that ask (``semspec.engine.states``; no speculation then).
    ``kv_cache_gb``: ``kv_budget_gb``'s. ``gpu_memory_utilization``: this engine's share of a
    GPU it shares (``engine_args.split_gpu_memory``; None: vLLM's default). ``draft_max_batch``:
    a speculating engine drafts only while at most this many requests run (None:
    ``CPU_SPECULATION_MAX_BATCH`` on a CPU, no limit on a GPU; 0: no limit). ``user``: vLLM's
    own arguments (``semspec.engine.engine_args``), checked, then merged over these: they win
    over every default here; the names semjobs must set itself are refused."""
    from semspec.engine import engine_args, states

    if user:
        engine_args.check(user, "engine arguments")
    on_cpu = runs_on_cpu(device)
    kv_gb = kv_budget_gb(kv_cache_gb, device)
    # Every engine gets the states connector, which does nothing for a request that does not
    # ask: vLLM keeps one worker-side connector per process, and once a states engine has
    # made it, an engine without a connector of its own fails its first step (a worker holds
    # ar's engine beside the step methods' pair).
    transfer, scheduler = states.connector_config(), None
    if states_layer is not None:
        speculative_config, scheduler = states.speculative_config(states_layer), states.scheduler_class()
    elif speculative_config:
        limit = CPU_SPECULATION_MAX_BATCH if draft_max_batch is None and on_cpu else draft_max_batch
        speculative_config = speculation_schedule(speculative_config, batch_size, limit)
        if on_cpu and speculative_config.get("method") in HEAD_METHODS:
            speculative_config = {"disable_eagle_block_drop": True, **speculative_config}
    shares = {} if gpu_memory_utilization is None else {"gpu_memory_utilization": gpu_memory_utilization}
    ours = dict(
        model=str(model_dir), tokenizer=str(model_dir), dtype=vllm_dtype("cpu" if on_cpu else "cuda", dtype),
        seed=seed, max_num_seqs=batch_size, enable_prefix_caching=True, enforce_eager=not compile,
        disable_log_stats=True, kv_cache_memory_bytes=None if kv_gb is None else int(kv_gb * 2**30), **shares,
        block_size=CPU_BLOCK_SIZE if on_cpu else None, speculative_config=speculative_config,
        # each request's drafted and accepted tokens, for its counters and step log
        per_request_spec_decode_metrics="detailed" if speculative_config and states_layer is None else "none",
        kv_transfer_config=transfer,
        # weights from safetensors only: a pickled checkpoint (.bin, .pt) is code that runs as it
        # loads, and every model semjobs ships or converts (a GGUF too) is safetensors
        load_format="safetensors",
        # states engines: our scheduler drops extract_hidden_states' drafts, which vLLM's async
        # scheduling (its default for that method on a GPU) would hand over another way
        **({"scheduler_cls": scheduler, "async_scheduling": False} if scheduler else {}),
    )
    return {**ours, **(user or {})}


def speculation_schedule(speculative_config: dict, batch_size: int, limit: int | None) -> dict:
    """``speculative_config`` drafting only while at most ``limit`` requests run (None or 0: at
    every batch size; a schedule the caller gave is kept)."""
    if not limit or limit >= batch_size or "num_speculative_tokens_per_batch_size" in speculative_config:
        return speculative_config
    tokens = speculative_config["num_speculative_tokens"]
    schedule = [(1, limit, tokens), (limit + 1, batch_size, 0)]
    return {**speculative_config, "num_speculative_tokens_per_batch_size": schedule}


def configure_process() -> None:
    """Environment vLLM reads when an engine starts: the engine in this process (no engine
    core process of its own), and its log at errors only (set VLLM_LOGGING_LEVEL to see
    more): at warning level it prints hundreds of lines per start about choices made here on
    purpose (eager mode, a float32 checkpoint cast to bfloat16 weight by weight, no tcmalloc
    preloaded), and a failure to start is raised anyway."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


def _shield_llvmlite() -> None:
    """Let a second engine start in a process where an ngram engine ran. vLLM's CPU start-up
    (0.32.0, ``triton_utils.dispatcher.register_kernels``) reads ``vars(obj)`` of every object
    in every loaded module; llvmlite's library wrapper, which vLLM's ngram drafter loads
    through numba, answers any unknown attribute, ``__dict__`` included, with a C-function
    wrapper, and the scan raises. Giving it a real ``__dict__`` entry ends that."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is not None and hasattr(ffi, "lib"):
        ffi.lib._fntab.setdefault("__dict__", {})


def model_files(model_dir: Path) -> tuple[Any, Any, set[int]]:
    """(tokenizer, config, end-of-sequence ids) of a model directory vLLM loads."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig as HFGenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    try:
        generation = HFGenerationConfig.from_pretrained(model_dir, local_files_only=True)
    except OSError:  # the model ships none
        generation = None
    return tokenizer, config, eos_token_ids(config, generation, tokenizer)


def start_engine(args: Any) -> Any:
    """vLLM's ``LLMEngine`` in this process, from ``EngineArgs``."""
    from vllm.v1.engine.llm_engine import LLMEngine

    from semspec.engine import vllm_cpu_fixes, vllm_cpu_sampling, vllm_cpu_speculation, vllm_cpu_verification

    # sampling on vLLM's CPU build, corrected and without a sort of the vocabulary per token,
    # steps that draft nothing without speculation's costs, drafted tokens verified by the
    # target's own draws (also their plugins, for engine processes vLLM starts itself)
    vllm_cpu_fixes.apply()
    vllm_cpu_sampling.apply()
    vllm_cpu_speculation.apply()
    vllm_cpu_verification.apply()
    # an engine dropped but not yet collected would, when collected, tear down the
    # per-process parallel state this one is about to share
    gc.collect()
    _shield_llvmlite()
    set_num_threads = torch.set_num_threads
    try:
        return LLMEngine.from_engine_args(args)
    finally:
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op, for its thread
        # binding; in this process it binds nothing, and transformers' passes, tests and
        # the thread that steps this engine (generate_many) need the real one
        torch.set_num_threads = set_num_threads


@dataclass
class _Running:
    """One request in vLLM: what its result needs."""

    key: Any
    config: GenerationConfig
    prompt_len: int
    t0: float
    ids: list[int] = field(default_factory=list)
    # (generated tokens so far, perf_counter) each time tokens came back, one per engine step
    # the request ran in: times the steps, and counts the target's passes
    arrivals: list[tuple[int, float]] = field(default_factory=list)
    doom: DoomWatch | None = None  # the doom rule's running check (GenerationConfig.stop_doomed)


@dataclass(frozen=True)
class Speculation:
    """What an engine speculates with (token_sd): vLLM's method, tokens drafted per
    verification, the draft's identity."""

    method: str
    tokens: int
    draft: ModelIdentity


class VLLMEngine:
    def __init__(self, llm: Any, tokenizer: Any, identity: ModelIdentity, dtype: str, max_context: int,
                 eos: set[int], version: str, model_dir: Path, threads: int, speculation: Speculation | None = None,
                 doom: DoomRule | None = None):
        """``model_dir``: what vLLM loaded; ``threads``: torch's threads in the thread that
        loaded it (see generate_many); ``speculation``: what it drafts with, when it serves
        token_sd (an engine serves either ar or token_sd: vLLM's speculation is the engine's, for
        every request it runs, or on a CPU while few run: ``CPU_SPECULATION_MAX_BATCH``)."""
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
        self.speculation = speculation
        self.doom = doom

    @classmethod
    def load(cls, target: str | None = None, draft: str | None = None, probes: str | None = None,
             device: str = "auto", cache_dir: str | os.PathLike | None = None, dtype: str = "auto",
             batch_size: int = 32, kv_cache_gb: float | None = None, compile: bool = False,
             seed: int = 0, speculative_tokens: int | None = None,
             engine_args: dict | None = None, draft_max_batch: int | None = None,
             doom_rule: str | os.PathLike | None = None) -> "VLLMEngine":
        """Start vLLM on the target spec (``semspec.models``: embedded name, GGUF, directory).
        ``speculative_tokens``: an engine for token_sd, drafting that many tokens per
        verification with ``draft`` (``semspec.engine.speculation``); without, one for ar.
        ``probes`` are the step-level methods' (``semspec.engine.step_engine``), unused here. ``batch_size``: requests decoded at
        once. ``kv_cache_gb``: the KV cache's whole budget (None: ``kv_budget_gb``'s default).
        ``compile``: vLLM's compiled graphs (slower start) instead of eager mode. ``engine_args``:
        vLLM's own arguments, over these (``engine_arguments``' ``user``). ``draft_max_batch``: token_sd
        drafts only while at most this many requests run (``engine_arguments``'). ``doom_rule``: a
        ``semspec.doom.DoomRule`` file, calibrated on this target, that stops the requests asking
        for it (``GenerationConfig.stop_doomed``) once they look doomed."""
        configure_process()
        import vllm
        from vllm import EngineArgs

        threads = torch.get_num_threads()
        model_dir, identity = model_source(target, models_cache(cache_dir))
        tokenizer, _, eos = model_files(model_dir)
        doom = DoomRule.load(doom_rule) if doom_rule else None
        if doom is not None:
            doom.check_target(str(identity))  # before the minutes vLLM takes to start
        speculation, spec_config = None, None
        if speculative_tokens:
            spec_config, draft_identity = speculative_config(draft, target, speculative_tokens, model_dir,
                                                             identity.sha256,
                                                             models_cache(cache_dir) or DEFAULT_CACHE_DIR)
            speculation = Speculation(spec_config["method"], speculative_tokens, draft_identity)
        args = EngineArgs(**engine_arguments(model_dir, device, dtype, batch_size, kv_cache_gb, compile, seed,
                                             spec_config, user=engine_args, draft_max_batch=draft_max_batch))
        dt = args.dtype
        llm = start_engine(args)
        engine = cls(llm, tokenizer, identity, dt, int(llm.model_config.max_model_len),
                     eos, vllm.__version__, model_dir, threads,
                     speculation, doom)
        # one token now: a model vLLM loads but cannot run (an attention shape its kernels
        # lack) fails the load, before any job is stored, instead of every item
        engine.generate("Hi", GenerationConfig(method="token_sd" if speculation else "ar", max_new_tokens=1,
                                               draft_tokens=speculative_tokens or GenerationConfig.draft_tokens))
        return engine

    # ------------------------------------------------------------------ what it serves
    @property
    def identities(self) -> dict[str, str]:
        """What made an output: the target's (and the draft's) identity, the number type and the engine."""
        drafted = {"draft": str(self.speculation.draft)} if self.speculation else {}
        doom = {"doom_rule": self.doom.identity} if self.doom else {}
        return {"target": str(self.identity), **drafted, "dtype": self.dtype, "engine": f"vllm {self.version}", **doom}

    def method_problem(self, method: str) -> str | None:
        if method not in METHODS:
            return f"unknown method {method!r}; one of {', '.join(METHODS)}"
        if method not in VLLM_METHODS:
            return (f"method {method!r} runs on the step-level engines (semspec.engine.step_engine), not on this "
                    f"one (it runs {', '.join(VLLM_METHODS)})")
        if (method == "token_sd") != (self.speculation is not None):
            return (f"this vLLM engine was started {'with' if self.speculation else 'without'} speculation; "
                    f"{method} needs one started {'without' if self.speculation else 'with'}")
        return None

    # ------------------------------------------------------------------ decoding
    def generate_many(self, prompts: Iterable, config: GenerationConfig | None = None,
                      batch_size: int = 8) -> Iterator[Finished]:
        """Decode up to ``batch_size`` prompts at once, yielding a :class:`Finished` as each
        ends: ``prompts`` (texts, message lists or :class:`Request`) read lazily, one as each
        slot frees; None from a live source means nothing new yet; a bad prompt fails alone;
        an Abort from the source ends that request at once (``semspec.intake``)."""
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
                            spent = len(running.pop(rid).ids)
                            yield Finished(req.key, None, Cancelled(f"request {req.key!r} aborted", spent))
                        continue
                    try:
                        self._add(req.key, req.prompt, req.config or default, running)
                    except Exception as e:  # noqa: BLE001 -- whatever one request raises (a bad prompt or
                        yield Finished(req.key, None, e)  # config, a template that throws) fails it alone
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
                        yield self._finished(run, out.outputs[0])
                    elif run.doom is not None and run.doom.doomed:
                        self.llm.abort_request([out.request_id])
                        del running[out.request_id]
                        yield self._finished(run, out.outputs[0], doomed=True)
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
        if self.speculation and config.draft_tokens != self.speculation.tokens:
            raise ValueError(f"draft_tokens={config.draft_tokens}, but vLLM drafts the same number for every "
                             f"request of an engine: this one drafts {self.speculation.tokens}")
        ids = prompt_ids(self.tokenizer, prompt, config.chat_template_kwargs, self.max_context)
        params = SamplingParams(
            temperature=config.temperature, top_p=config.top_p if config.temperature > 0 else 1.0,
            seed=config.seed if config.temperature > 0 and config.reproducible else None,
            max_tokens=min(config.max_new_tokens, self.max_context - len(ids)),
            stop_token_ids=sorted(self.eos), detokenize=False, output_kind=RequestOutputKind.DELTA,
            **vllm_detection(config.stop_loops),
            **({"logprobs": self.doom.logprobs} if self._dooms(config) and self.doom.logprobs is not None else {}),
        )
        request_id = str(self._next_id)
        self._next_id += 1
        t0 = time.perf_counter()
        self.llm.add_request(request_id, self.llm.renderer.render_cmpl([{"prompt_token_ids": ids}])[0], params)
        # only once vLLM holds it: a request it refused would be waited for for ever
        running[request_id] = _Running(key, config, len(ids), t0,
                                       doom=DoomWatch(self.doom) if self._dooms(config) else None)

    def _dooms(self, config: GenerationConfig) -> bool:
        """Whether the doom rule watches a request: it asks (stop_doomed), this engine has one,
        and it samples (a greedy job's one answer is not resampled)."""
        return self.doom is not None and config.stop_doomed and config.temperature > 0

    @staticmethod
    def _take(run: _Running, out: Any) -> None:
        completion = out.outputs[0]
        new = completion.token_ids
        if new:
            run.ids.extend(new)
            run.arrivals.append((len(run.ids), time.perf_counter()))
            if run.doom is not None and completion.logprobs is None:  # a length rule: it counts tokens
                for _ in new:
                    run.doom.add(0.0)
            elif run.doom is not None:
                signal = run.doom.rule.signal
                for token, logprobs in zip(new, completion.logprobs[-len(new):]):
                    run.doom.add(token_signal(signal, logprobs[token].logprob, (p.logprob for p in logprobs.values())))

    def _finished(self, run: _Running, output: Any, doomed: bool = False) -> Finished:
        try:
            return Finished(run.key, self._result(run, output, doomed))
        except Exception as e:  # noqa: BLE001 -- a result that cannot be made fails its item alone
            return Finished(run.key, None, e)

    def _result(self, run: _Running, output: Any, doomed: bool = False) -> GenerationResult:
        """The result of a finished request (``output``: its last ``CompletionOutput``), or of
        one stopped by the doom rule (``doomed``: its text as far as it got)."""
        ids = run.ids
        finish = "doomed" if doomed else "eos" if output.finish_reason == "stop" else "length"
        if ids and ids[-1] in self.eos:
            ids = ids[:-1]  # the end-of-sequence token is not part of the text (semspec.types' counting)
        cfg = run.config
        cut = None
        if cfg.stop_loops and finish != "eos":
            # vLLM ended a loop where the rule fires (or the cap came with the token it fires on)
            # vLLM checked every shorter prefix as its tokens came: only the whole one is left
            cut = find_loop(ids, DEFAULT_RULE, checked=len(ids) - 1, line_breaks=line_break_ids(self.tokenizer))
            if cut is not None or output.finish_reason == "repetition":
                finish = "repetition"
            if cut is not None:
                ids = ids[:cut]
        think_end = self.think_end_marker if cfg.think_end == "auto" else (cfg.think_end or None)
        detector = StepDetector(cfg.step_delimiter or DEFAULT_STEP_DELIMITER, think_end,
                                cfg.max_step_tokens or DEFAULT_MAX_STEP_TOKENS)
        drafted, accepted, verified = self._verifications(run, output.spec_decode_metrics, len(ids), cut)
        steps = self._steps(ids, step_spans(self.tokenizer, ids, detector), run, verified)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        reasoning, content = split_reasoning(text, think_end)
        first = run.arrivals[0][1] if run.arrivals else run.t0
        last = run.arrivals[-1][1] if run.arrivals else run.t0
        counters = Counters(prompt_tokens=run.prompt_len, generated_tokens=len(ids),
                            target_forward_passes=len(run.arrivals), drafted_tokens=drafted, accepted_tokens=accepted,
                            # a draft model or head runs once per drafted token; ngram and suffix run none
                            draft_forward_passes=drafted if self.speculation
                            and self.speculation.method not in MODEL_FREE_METHODS else 0,
                            cut_tokens=0 if cut is None else len(run.ids) - cut,
                            phase_seconds={"prefill": first - run.t0, "target_write": last - first})
        return GenerationResult(
            text=text, final_answer=final_answer(text, think_end), reasoning=reasoning, content=content,
            steps=steps, counters=counters, wall_seconds=time.perf_counter() - run.t0,
            finish_reason=finish, models=self.identities,
        )

    @staticmethod
    def _verifications(run: _Running, metrics: Any, kept: int,
                       cut: int | None = None) -> tuple[int, int, list[tuple[int, int, int]]]:
        """(tokens drafted, tokens accepted, and per verification pass: the first kept token
        it delivered, tokens drafted, tokens accepted) of a speculating engine's request, from
        vLLM's per-request metrics (``kept``: tokens in the result; ``cut``: where a loop was
        cut, the passes after it are left out of the list). The totals are vLLM's; the
        passes are placed only where vLLM listed one for every step after the prompt's (a
        step with nothing drafted, as ngram's without a match or the first after a preempted
        request is recomputed, lists none); else only the counters carry them."""
        if metrics is None:
            return 0, 0, []
        accepted = sum(j * count for j, count in enumerate(metrics.histogram))
        starts = [min(count, kept - 1) for count, _ in run.arrivals[:-1]]  # an EOS-only last step counts
        if len(metrics.per_step_drafted) != len(starts) or kept == 0:      # in the last kept token's step
            return metrics.num_draft_tokens, accepted, []
        passes = list(zip(starts, metrics.per_step_drafted, metrics.per_step_accepted))
        if cut is not None:
            passes = [p for p, (count, _) in zip(passes, run.arrivals) if count < cut]
        return metrics.num_draft_tokens, accepted, passes

    def _steps(self, ids: list[int], spans: list[tuple[int, int]], run: _Running,
               verified: list[tuple[int, int, int]]) -> list[StepRecord]:
        """The step log: the target wrote (or, speculating, verified) every step; each step's
        seconds run from the moment its first token came back to its last (the first step's
        from the request's start); a verification counts for the step its first token is in."""
        counts = [count for count, _ in run.arrivals]

        def arrived(n: int) -> float:  # when the n-th generated token came back
            i = min(bisect.bisect_left(counts, n), len(counts) - 1)
            return run.arrivals[i][1] if counts else run.t0

        steps = []
        for index, (start, end) in enumerate(spans):
            began = run.t0 if start == 0 else arrived(start)
            mine = [(d, a) for first, d, a in verified if start <= first < end]
            steps.append(StepRecord(
                index=index, author="target", text=self.tokenizer.decode(ids[start:end], skip_special_tokens=False),
                drafted_tokens=sum(d for d, _ in mine), accepted_tokens=sum(a for _, a in mine),
                decision="token_verified" if self.speculation else "target_only", target_tokens=end - start,
                seconds=arrived(end) - began,
            ))
        return steps

    def generate(self, messages: list[dict] | str, config: GenerationConfig | None = None) -> GenerationResult:
        """One prompt; errors are raised."""
        (done,) = self.generate_many([messages], config, batch_size=1)
        if done.error is not None:
            raise done.error
        return done.result

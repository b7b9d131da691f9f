"""The worker's one door to the decoding engine, and the per-process model cache.

`get_engine(method)` loads the engine that serves `method` (vLLM's: `semspec.engine.token_engine` for
`ar` and `token_sd`, `semspec.engine.step_engine` for the step-level methods; or
`settings.engine_factory`) on first use in *this* process
and keeps it: a Celery prefork child loads it in the child (never in the parent,
which must not touch CUDA), `--pool solo` and `semjobs run` load it in their only process.
The per-item code hands items to the engine through this process's batch loop
(`semjobs.worker.batching`), which calls `engine.generate_many`. A worker's engines share
its GPU's memory (`semjobs.worker.gpu_memory`).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from semjobs.settings import settings
from semjobs.worker import gpu_memory
from semjobs.worker.batching import forget_loop

_lock = threading.Lock()  # held while an engine loads (minutes): one load at a time
_held = threading.Lock()  # the cache and its users, never held for long
_cache: dict[tuple, Any] = {}
_users: dict[tuple, int] = {}  # engine key -> chunks decoding with it now (in_use)
# The last failed load: (key, when, error). Chunks arriving meanwhile get the same error
# instead of each loading the models again, until settings.engine_retry_s has passed.
_failure: tuple[tuple, float, str] | None = None
# Whether this process is a worker's, which may come to hold the engines of every method it
# serves (settings.methods), sharing its GPU (semjobs.worker.gpu_memory); set as it starts
# (plan_as_worker); not `semjobs run`'s, which decodes one job's method.
_worker_process = False


def plan_as_worker() -> None:
    """Plan this process's GPU memory for the engines of every method it serves (a worker's, as
    it starts)."""
    global _worker_process
    _worker_process = True


class EngineLoadError(RuntimeError):
    """The engine could not be loaded: a worker problem, not an item's."""


class EngineBusy(RuntimeError):
    """Serving this request would drop an engine that other chunks are decoding with (a
    worker holds one vLLM engine at a time): try again once they are done."""


def resolve(path: str) -> Callable[..., Any]:
    """"package.module:Attr.attr" -> the object."""
    module_name, _, attrs = path.partition(":")
    if not attrs:
        raise ValueError(f"engine factory {path!r} must look like 'module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


# ar and token_sd run on one vLLM engine (with vLLM's speculation for token_sd); the step-level
# methods (semspec.types.VLLM_STEP_METHODS) on a target and a draft engine that return the
# probes' states.
VLLM_FACTORY = "semspec.engine.token_engine:VLLMEngine.load"
VLLM_STEPS_FACTORY = "semspec.engine.step_engine:VLLMStepEngine.load"
# The factories' arguments for vLLM's own engine arguments, by role (settings.<role>_engine_args)
ENGINE_ARGS_KWARGS = {"target": "engine_args", "draft": "draft_engine_args"}


def engine_args_extra(roles: tuple[str, ...] = tuple(ENGINE_ARGS_KWARGS), shares: dict[str, float] | None = None
                      ) -> dict:
    """The settings' engine arguments of ``roles`` as a factory's extra arguments, with a
    role's engines' share of the GPU (``shares``, by role) as its ``gpu_memory_utilization``;
    those of a role without any left out (an engine loaded without any keeps its key)."""
    shares = shares or {}
    given = {role: {**getattr(settings, f"{role}_engine_args"),
                    **({"gpu_memory_utilization": shares[role]} if role in shares else {})} for role in roles}
    return {ENGINE_ARGS_KWARGS[role]: args for role, args in given.items() if args}


def factory_for(method: str | None = None, draft_tokens: int | None = None,
                layers: tuple | None = None) -> tuple[str, dict]:
    """(the factory that loads ``method``'s engine, the extra arguments it takes);
    ``draft_tokens``: the job's, which a vLLM engine for token_sd drafts for every request;
    ``layers``: ((role, hidden_states index), ...) a probe calibration reads, which the
    step-level engines then store instead of the probes' (other engines read any)."""
    if settings.engine_factory:
        return settings.engine_factory, engine_args_extra()
    from semspec.types import VLLM_STEP_METHODS

    method = method or settings.method
    extra = {"kv_cache_gb": settings.kv_cache_gb, "compile": bool(settings.vllm_compile)}
    if settings.doom_rule is not None:  # semspec.doom: the jobs that ask for it (stop_doomed)
        extra["doom_rule"] = str(settings.doom_rule)
    shares = gpu_memory.engine_shares() if _worker_process else {}
    if method in VLLM_STEP_METHODS:
        if layers is not None:
            extra["layers"] = layers
        # the writer takes the target's arguments: its share is the target's (the same model)
        by_role = {role: shares[role] for role in ("target", "draft") if role in shares}
        return VLLM_STEPS_FACTORY, {**extra, **engine_args_extra(shares=by_role)}
    # ar's and token_sd's one engine is the target's
    by_role = {"target": shares[gpu_memory.TOKEN_ENGINE]} if shares else {}
    extra.update(engine_args_extra(("target",), by_role))
    if method == "token_sd":
        from semspec.types import GenerationConfig

        extra["speculative_tokens"] = draft_tokens or GenerationConfig.draft_tokens
        if settings.draft_max_batch is not None:  # else the engine's choice (two requests on a CPU)
            extra["draft_max_batch"] = settings.draft_max_batch
    return VLLM_FACTORY, extra


def engine_key(factory: str, extra: dict) -> tuple:
    """(which engine with which extra arguments, the settings it was loaded for): an engine
    of another factory for the same settings stays loaded beside it (ar's beside the step
    methods' pair); those for other settings, or of the same factory with other extra
    arguments (with and without speculation), are dropped when it loads."""
    loaded_for = (settings.target_model, settings.draft_model, settings.probes_dir, settings.device,
                  settings.dtype, settings.batch_size, os.getpid())
    # engine arguments (dicts) as JSON text: a key must hash
    frozen = {k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v for k, v in extra.items()}
    return (factory, tuple(sorted(frozen.items()))), loaded_for


def set_threads() -> None:
    """Apply settings.threads to torch in this process, before the engine loads. Called from
    get_engine so it runs where the engine runs (a prefork child, never the parent, which
    must not import torch) and once per process, since the engine is loaded once."""
    if settings.threads is not None:
        import torch

        torch.set_num_threads(settings.threads)


def get_engine(method: str | None = None, draft_tokens: int | None = None, layers: tuple | None = None) -> Any:
    """This process's engine for ``method`` (default: settings.method; ``draft_tokens``: the
    job's), loaded on first use. One per factory: a worker serving `ar` and `semspec` holds
    both; one serving `ar` and then `token_sd` swaps its engine (vLLM speculates for every
    request of an engine, or for none), which raises EngineBusy while chunks decode with the
    one it would drop."""
    return _get(method, draft_tokens, layers=layers)[0]


@contextmanager
def in_use(method: str | None = None, draft_tokens: int | None = None,
           layers: tuple | None = None) -> Iterator[Any]:
    """``get_engine``'s engine, counted as in use until the block ends: no other request
    drops it meanwhile (they get EngineBusy)."""
    engine, key = _get(method, draft_tokens, use=True, layers=layers)
    try:
        yield engine
    finally:
        with _held:
            _users[key] -= 1


def _get(method: str | None, draft_tokens: int | None, use: bool = False,
         layers: tuple | None = None) -> tuple[Any, tuple]:
    global _failure
    factory_path, extra = factory_for(method, draft_tokens, layers)
    key = engine_key(factory_path, extra)
    with _held:  # loaded: no wait for a load of another engine in progress
        engine = _cache.get(key)
        if engine is not None:
            if use:
                _users[key] = _users.get(key, 0) + 1
            return engine, key
    with _lock:
        engine = _cache.get(key)
        if engine is None:
            if _failure is not None and _failure[0] == key and time.monotonic() - _failure[1] < settings.engine_retry_s:
                raise EngineLoadError(_failure[2])
            # drop engines loaded for other settings, or of this factory for others, first:
            # their memory, and vLLM's per-process state, which freeing one after the next
            # started would tear down (so never one a chunk still decodes with)
            with _held:
                drop = [k for k in _cache if k[1] != key[1] or k[0][0] == key[0][0]]
                if any(_users.get(k) for k in drop):
                    raise EngineBusy("this worker's engine is decoding another job's items with other settings")
                dropped = [_cache.pop(k) for k in drop]
            while dropped:  # popped: no reference here keeps a dropped engine alive
                forget_loop(dropped.pop())  # waits for what its loop still decodes (an abandoned chunk's)
            try:
                set_threads()
                factory = resolve(factory_path)
                engine = factory(
                    target=settings.target_model,
                    draft=settings.draft_model,
                    probes=settings.probes_dir,
                    device=settings.device,
                    cache_dir=settings.cache_dir,
                    dtype=settings.dtype,
                    batch_size=settings.batch_size,
                    **extra,
                )
            except Exception as e:
                message = f"could not load the engine {factory_path!r}: {type(e).__name__}: {e}"
                _failure = (key, time.monotonic(), message)
                raise EngineLoadError(message) from e
            _failure = None
        with _held:
            _cache[key] = engine
            if use:
                _users[key] = _users.get(key, 0) + 1
    return engine, key


def loaded() -> bool:
    return bool(_cache)


def identities(engine: Any) -> dict:
    """What makes ``engine``'s outputs, for a job's manifest: its identities, and the engine
    arguments it was started with by role (``engine_args``), when it was given any."""
    ids = dict(getattr(engine, "identities", None) or {})
    started_with = _engine_args_of(engine)
    return {**ids, "engine_args": started_with} if started_with else ids


def _engine_args_of(engine: Any) -> dict[str, dict]:
    """role -> the engine arguments this process's ``engine`` was loaded with (its cache key's)."""
    with _held:
        key = next((k for k, e in _cache.items() if e is engine), None)
    extra = dict(key[0][1]) if key is not None else {}
    return {role: json.loads(extra[kwarg]) for role, kwarg in ENGINE_ARGS_KWARGS.items() if kwarg in extra}


def method_problems(engine: Any) -> dict[str, str]:
    """method -> why ``engine`` cannot run it (``Engine.method_problem``), for the methods
    it cannot; empty for an engine that does not say."""
    from semspec.types import METHODS

    check = getattr(engine, "method_problem", None)
    problems = {m: check(m) for m in METHODS} if check is not None else {}
    return {m: p for m, p in problems.items() if p}

"""vLLM's own engine arguments, given per role: ``target`` (ar's and token_sd's engine, the step
engines' target and writer) and ``draft`` (the step engines' draft). Names are vLLM's
``EngineArgs`` fields (``tensor_parallel_size``, ``max_model_len``, ``quantization``,
``gpu_memory_utilization``, ...); they override semjobs' defaults
(``semspec.engine.token_engine.engine_arguments``), but not the names semjobs sets itself
(``OWNED``).

    check({"max_model_len": 4096}, "--engine-arg")   # True: checked against vLLM's EngineArgs
    parse_assignment("tensor_parallel_size=2")       # ("tensor_parallel_size", 2)

Also the split of one GPU's memory among the engines a process holds on it (``shares_by_size``,
``split_gpu_memory``). Nothing here imports vLLM until a check or a split needs it: a machine
that only submits jobs may lack it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import importlib.util
import json
import math
import struct
import typing
from pathlib import Path
from typing import Any

ROLES = ("target", "draft")

_FROM_SPEC = ("semjobs hands vLLM the local directory the model spec resolved to "
              "(SEMJOBS_TARGET_MODEL, SEMJOBS_DRAFT_MODEL); name the model there")
_SPECULATION = "token_sd's draft (SEMJOBS_DRAFT_MODEL, the job's draft_tokens) and the step engines' states set it"
_STATES = "the step engines read the probes' hidden states through it (semspec.engine.states)"
# The names semjobs sets itself, and why a user may not: one source for the refusal and the docs.
OWNED = {
    "model": _FROM_SPEC,
    "tokenizer": "every prompt is rendered with the model's own tokenizer (semspec.prompts)",
    "revision": _FROM_SPEC,
    "tokenizer_revision": _FROM_SPEC,
    "code_revision": _FROM_SPEC,
    "seed": "SEMJOBS_SEED and the job's seed set it; each request carries its own",
    "speculative_config": _SPECULATION,
    "spec_method": _SPECULATION,
    "spec_model": _SPECULATION,
    "spec_tokens": _SPECULATION,
    "kv_transfer_config": _STATES,
    "scheduler_cls": _STATES,
    "async_scheduling": "the step engines' states need it off; vLLM chooses for the others",
    "per_request_spec_decode_metrics": "each result's drafted and accepted tokens are read from it",
    "logprobs_mode": "step_judge reads the judge's processed log-probabilities",
    "load_format": "weights load from safetensors only: a pickled checkpoint runs code as it loads",
    "trust_remote_code": "a model repository's own Python code would run in every worker; semjobs runs the "
                         "architectures vLLM ships",
    "hf_token": "a secret, and engine arguments are stored in job manifests and exports: set HF_TOKEN in the "
                "environment of the processes that fetch models",
}


class EngineArgsError(ValueError):
    """Engine arguments vLLM would refuse, or that semjobs sets itself."""


def parse_assignment(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, value): the value parsed as JSON where it parses (2, 0.5, true,
    {"mode": 3}), else the string itself (fp8, awq)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise EngineArgsError(f"{text!r}: expected KEY=VALUE, e.g. max_model_len=32768")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (looked up, not imported: importing takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def check(args: dict[str, Any], where: str) -> bool:
    """Refuse ``args`` (EngineArgsError, one line per problem, each naming ``where``, the
    setting or option they came from) when one is semjobs' own, unknown to vLLM's
    ``EngineArgs`` (with the closest name) or of a type its field refuses. True when checked
    against vLLM; False where vLLM is not installed, when only the owned names were."""
    problems = [f"{where}: {name!r} is set by semjobs: {OWNED[name]}" for name in args if name in OWNED]
    checked = vllm_installed()
    if checked:
        problems += [f"{where}: {problem}" for problem in _vllm_problems({k: v for k, v in args.items()
                                                                         if k not in OWNED})]
    if problems:
        raise EngineArgsError("\n".join(problems))
    return checked


@functools.cache
def _fields() -> dict[str, dataclasses.Field]:
    """vLLM's public engine arguments by name."""
    from vllm.engine.arg_utils import EngineArgs

    return {f.name: f for f in dataclasses.fields(EngineArgs) if not f.name.startswith("_")}


def _vllm_problems(args: dict[str, Any]) -> list[str]:
    fields = _fields()
    problems = []
    for name, value in args.items():
        field = fields.get(name)
        if field is None:
            close = difflib.get_close_matches(name, fields, n=1)
            problems.append(f"unknown engine argument {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                            + ": names are vLLM's EngineArgs fields")
            continue
        problem = _type_problem(field, value)
        if problem:
            problems.append(f"{name}={json.dumps(value, default=repr)}: {problem}")
    return problems


def _type_problem(field: dataclasses.Field, value: Any) -> str | None:
    """Why ``value`` does not fit the field's declared type, where pydantic can tell: strictly
    as JSON (no "yes" for a bool, no 2.5 for an int), an enum also by its member's name as vLLM's
    own command line takes it, and a config class (compilation_config) from a JSON object."""
    from pydantic import TypeAdapter, ValidationError
    from pydantic.errors import PydanticSchemaGenerationError

    if value is None and field.default is None:  # declared `int = None` (max_model_len): unset
        return None
    try:
        adapter = TypeAdapter(field.type)
    except PydanticSchemaGenerationError:  # a type pydantic has no schema for (torch.dtype): vLLM checks it
        return None
    try:
        adapter.validate_json(json.dumps(value), strict=True)
    except (TypeError, ValueError) as e:  # ValidationError is a ValueError; TypeError: not JSON
        if isinstance(value, str) and any(value in kind.__members__ for kind in _enums(field.type)):
            return None
        return e.errors()[0]["msg"] if isinstance(e, ValidationError) else "not a JSON value"
    return None


def _enums(tp: Any) -> list[type[enum.Enum]]:
    """The enum classes a type hint names, at any depth."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return [tp]
    return [e for arg in typing.get_args(tp) for e in _enums(arg)]


def split_gpu_memory(total: float, sizes: dict[str, int], given: dict[str, float]) -> dict[str, float]:
    """Each engine's ``gpu_memory_utilization`` when engines share one GPU (vLLM's fraction of
    the GPU an engine may take, weights and KV cache together, checked against what is free
    as it starts): an engine in ``given`` keeps its own, the others share what is left of
    ``total`` in proportion to their parameter counts (``sizes``), so each gets room for its
    weights and a KV cache of the same proportion. ValueError when ``given`` leaves nothing."""
    left = total - sum(given.values())
    sharing = {name: size for name, size in sizes.items() if name not in given}
    if sharing and left <= 0:
        raise ValueError(f"the gpu_memory_utilization given ({', '.join(f'{k} {v}' for k, v in given.items())}) "
                         f"leaves nothing of {total} for {', '.join(sharing)} on the same GPU")
    whole = sum(sharing.values())
    return {**given, **{name: left * size / whole for name, size in sharing.items()}}


def shares_by_size(sizes: dict[str, int], engine_args: dict[str, dict]) -> dict[str, float]:
    """Each engine's gpu_memory_utilization where engines of these parameter counts (``sizes``,
    by engine name) share one GPU: vLLM's default fraction split among them by size, those
    whose ``engine_args`` (by engine name) set one keeping theirs (``split_gpu_memory``)."""
    from vllm.engine.arg_utils import EngineArgs

    given = {name: engine_args[name]["gpu_memory_utilization"] for name in sizes
             if "gpu_memory_utilization" in engine_args.get(name, {})}
    return split_gpu_memory(EngineArgs.gpu_memory_utilization, sizes, given)


def parameter_count(model_dir: str | Path) -> int:
    """The parameters in a model directory's safetensors files, read from their headers."""
    paths = sorted(Path(model_dir).glob("*.safetensors"))
    if not paths:  # vLLM loads safetensors only (OWNED["load_format"])
        raise ValueError(f"{model_dir} holds no .safetensors weights")
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total

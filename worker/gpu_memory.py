"""One GPU's memory shared by every engine a worker process may hold.

A worker's queues carry the methods it serves (``settings.methods``, every method unless it
says; ``semjobs.worker.queues``), and a worker process keeps each kind of engine once loaded
(``semjobs.worker.engine``): ar's or token_sd's one engine (the target, with token_sd's draft
model inside it; swapped between the two, never both) and, where the pair's draft drafts steps,
the step engines (the target, the draft and, where the target's own writing speculates, the
writer). vLLM gives an engine a fraction of the whole GPU (``gpu_memory_utilization``, weights
and KV cache together), checked against what is free as it starts: each kind split on its own
would ask for vLLM's 0.92 again. The kinds load lazily, one at a time, so where a worker serves
methods of both kinds the split is decided before the first of them, over every engine the
process may come to hold: vLLM's default fraction shared by parameter counts
(``semspec.engine.engine_args.shares_by_size``); where a role's engine arguments give
``gpu_memory_utilization``, every engine of that role keeps it and the others share the rest.
Each engine then gets its share as its role's ``gpu_memory_utilization`` (which a job's
manifest names among its engine arguments). A worker of one kind's methods only (``--method
semspec``), and `semjobs run`, whose process decodes one job's method, leave the split to that
kind's engines. docs/gpu.md.
"""

from __future__ import annotations

import functools
import json

from semjobs.settings import settings
from semjobs.worker.queues import served_methods
from semspec.types import VLLM_STEP_METHODS

TOKEN_ENGINE = "token"  # ar's and token_sd's engine, beside the step engines' target, draft, writer
# whose engine arguments each engine takes
ROLE_OF = {TOKEN_ENGINE: "target", "target": "target", "draft": "draft", "writer": "target"}


def engine_shares() -> dict[str, float]:
    """Engine ("token", "target", "draft", "writer") -> its gpu_memory_utilization, for the
    settings' pair on a GPU where the process may hold both kinds; empty where it holds one
    kind only (on a CPU, a worker of one kind's methods, a pair whose draft drafts no steps),
    or its models cannot be read (their load then says why)."""
    methods = set(served_methods())
    if not (methods & set(VLLM_STEP_METHODS) and methods - set(VLLM_STEP_METHODS)):
        return {}
    args = {role: json.dumps(getattr(settings, f"{role}_engine_args"), sort_keys=True) for role in ("target", "draft")}
    return dict(_shares(settings.target_model, settings.draft_model, settings.probes_dir, str(settings.cache_dir),
                        settings.device, args["target"], args["draft"]))


@functools.cache  # asked at every chunk's engine look-up; reads the models' headers once
def _shares(target: str | None, draft: str | None, probes: str | None, cache_dir: str, device: str,
            target_args: str, draft_args: str) -> tuple[tuple[str, float], ...]:
    from semspec.engine.engine_args import parameter_count, shares_by_size
    from semspec.engine.step_engine import step_engine_models
    from semspec.engine.token_engine import runs_on_cpu

    if runs_on_cpu(device):
        return ()
    try:
        sizes = {name: parameter_count(path)
                 for name, path in step_engine_models(target, draft, probes, cache_dir).items()}
    except Exception:  # noqa: BLE001  (a model that cannot be read: its engine's load reports it)
        return ()
    if not sizes:
        return ()
    sizes[TOKEN_ENGINE] = sizes["target"] + sizes["draft"]  # token_sd's engine holds the draft model too
    by_role = {"target": json.loads(target_args), "draft": json.loads(draft_args)}
    return tuple(shares_by_size(sizes, {name: by_role[ROLE_OF[name]] for name in sizes}).items())

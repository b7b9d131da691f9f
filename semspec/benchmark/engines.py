"""What ``semjobs bench`` decodes with, per prompt: vLLM's engines, and transformers' models
for the peers and the quality pass.

- ``ar``, ``step_judge`` and ``semspec`` run on one ``VLLMStepEngine`` (the target and a draft
  model, storing the probes' states), so that semspec's speed-up is over ``ar`` on the same
  machinery; ``token_sd`` on a ``VLLMEngine`` speculating with a draft head or ``ngram``
  (vLLM speculates for every request of an engine, so it gets one of its own, started only
  when planned). Each draft of ``compare_drafts`` gets engines of its own likewise.
- ``hf_generate`` and ``hf_assisted`` (with the step engine's draft) are transformers'
  ``generate`` on models loaded by ``semspec.models``, which also score every output's
  target log-likelihood.

A draft decodes only what vLLM can draft with it: a draft model whole steps (semspec,
step_judge), a head or ngram tokens (token_sd); the other runs are skipped with the reason.
The engines live as long as this object: vLLM tears down its process state when one is freed.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch

from semspec.models.loaded import LoadedModel
from semspec.types import GenerationConfig

# The methods that decode on the step engine (token_sd decodes on a speculating one).
STEP_LEVEL = ("ar", "step_judge", "semspec")
# Requests an engine holds at once: the bench decodes one prompt at a time, but semspec's
# sampled draft attempts at a step are in flight together.
BENCH_SLOTS = 4
FORCED_PROBES = {"accept": (1.0, 1.0), "reject": (0.0, 1.0)}  # (p_T, p_D); also "const:P_T,P_D"


def draft_refusal(spec: str | None) -> str | None:
    """Why the bench cannot decode with draft ``spec`` at all (None when it can)."""
    if spec and str(spec).startswith("first:"):
        return (f"draft {spec!r} (the target's first layers, built in memory) cannot run on vLLM, which "
                "loads models from their files: save such a model to a directory and give that")
    return None


@dataclass
class BenchEngines:
    """vLLM engines by (draft of ``compare_drafts``, or None for the main one; method), why a
    planned method has none, and the transformers models (``target`` when a peer or the
    log-likelihood pass needs it; ``assistant``: hf_assisted's draft)."""

    serving: dict[tuple[str | None, str], Any] = field(default_factory=dict)
    unavailable: dict[tuple[str | None, str], str] = field(default_factory=dict)
    target: LoadedModel | None = None
    assistant: LoadedModel | None = None
    assistant_problem: str = "hf_assisted was not planned"

    def problem(self, run) -> str | None:
        """Why ``run`` (a ``runner.MethodRun``) cannot run here; None when it can."""
        if run.method == "hf_assisted":
            return None if self.assistant is not None else self.assistant_problem
        if run.method == "hf_generate":
            return None if self.target is not None else "the transformers target was not loaded"
        key = (run.draft, run.method)
        return None if key in self.serving else self.unavailable.get(key, "no engine was loaded for it")

    @property
    def steps(self):
        """The main step engine (the one ``ar`` runs on)."""
        return self.serving[(None, "ar")]

    def resolve(self, config, lane: str | None = None):
        """``config``'s step rule as the step engine of its method on ``lane`` (a draft of
        ``compare_drafts``; None: the main draft) fills it in; the main one where it has none."""
        return self.serving.get((lane, config.method), self.steps).resolve(config)

    @property
    def identities(self) -> dict[str, str]:
        """The main step engine's models, and the draft (and a compare lane's probes) every
        other engine decodes with."""
        ids = dict(self.steps.identities)
        for (draft, method), engine in self.serving.items():
            if engine is not self.steps and "draft" in engine.identities:
                ids[f"{method} draft" if draft is None else f"draft={draft}"] = engine.identities["draft"]
                for probe in ("target_probe", "draft_probe"):
                    if draft is not None and probe in engine.identities:
                        ids[f"{probe} of draft={draft}"] = engine.identities[probe]
        return ids

    def describe(self) -> dict[str, Any]:
        """What ``report.environment`` records of the engines."""
        specs = {"target": self.steps.target.shape.identity.name}
        if self.steps.draft is not None:
            specs["draft"] = self.steps.draft.shape.identity.name
        on_gpu = not self.steps.on_cpu
        return {"device": "cuda" if on_gpu else "cpu", "dtype": self.steps.dtype, "models": self.identities,
                "model_specs": specs, **({"gpu": torch.cuda.get_device_name()} if on_gpu else {})}


def load_engines(settings, target: str | None = None, draft: str | None = None, probes: str | None = None,
                 device: str = "auto", cache_dir: str | os.PathLike | None = None, dtype: str = "auto",
                 kv_cache_gb: float | None = None) -> BenchEngines:
    """The engines for ``settings``' methods and drafts (a ``runner.BenchSettings``): the
    embedded target by default, with its step draft and probes and, for token_sd, its head.
    ``probes`` also takes "accept", "reject" and "const:P_T,P_D" (constant probes on the
    last layers). ``dtype``: vLLM's number type (``vllm_dtype``), which the transformers
    models run in too. ValueError for a draft or probes the bench cannot take."""
    from semspec.engine.token_engine import vllm_dtype

    for refusal in filter(None, map(draft_refusal, (draft, *settings.compare_drafts))):
        raise ValueError(refusal)
    lanes = compare_lane_probes(settings, target)
    number_type = vllm_dtype(device, dtype)
    options = dict(device=device, cache_dir=cache_dir, dtype=number_type, batch_size=BENCH_SLOTS,
                   kv_cache_gb=kv_cache_gb, seed=settings.seed, engine_args=settings.engine_args)
    tokens = settings.draft_tokens or GenerationConfig.draft_tokens
    engines = BenchEngines()
    with tempfile.TemporaryDirectory(prefix="semjobs-bench-") as scratch:  # probes are read at load
        main_probes = _probe_spec(probes, target, draft, cache_dir, scratch)
        _load_lane(engines, None, target, draft, main_probes, {"ar", *settings.methods}, options, tokens,
                   settings.draft_engine_args)
    for spec, lane_probes in lanes.items():
        # the drafting methods once more per draft (ar runs once, on the main lane)
        _load_lane(engines, spec, target, spec, lane_probes, set(settings.methods) - {"ar"},
                   options, tokens, settings.draft_engine_args)
    methods = set(settings.methods)
    if settings.loglik or methods & {"hf_generate", "hf_assisted"}:
        engines.target = _transformers_model(target, device, cache_dir, number_type)
    if "hf_assisted" in methods:
        _load_assistant(engines, target, draft, device, cache_dir, number_type)
    return engines


def compare_lane_probes(settings, target: str | None = None) -> dict[str, str | None]:
    """The probes of each draft of ``settings.compare_drafts``: those ``compare_probes`` gives
    in the same place, else the draft's shipped ones (None: it has none). ValueError for more
    probes than drafts."""
    from semspec.components import default_probes

    drafts, given = settings.compare_drafts, settings.compare_probes
    if len(given) > len(drafts):
        raise ValueError(f"--compare-probes names {len(given)} probes for {len(drafts)} --compare-drafts")
    return {spec: (given[i] if i < len(given) else None) or default_probes(spec, target)
            for i, spec in enumerate(drafts)}


def _load_lane(engines: BenchEngines, lane: str | None, target, draft, probes, methods: set[str],
               options: dict, draft_tokens: int, draft_engine_args: dict) -> None:
    """Start the engines ``draft`` needs for ``methods`` and record why the others cannot run
    (``lane``: None for the main draft, which also runs ar, else its compare_drafts spec;
    ``draft_engine_args``: vLLM's arguments for the step engines' draft)."""
    from semspec.engine.token_engine import VLLMEngine
    from semspec.engine.speculation import draft_problem

    stepping = [m for m in STEP_LEVEL if m in methods]
    if stepping:
        # ar alone needs the target alone: no draft engine to start
        step_draft, step_probes = ("none", "none") if stepping == ["ar"] else (draft, probes)
        step_options = {**options, "draft_tokens": draft_tokens, "draft_engine_args": draft_engine_args}
        engine, problem = _step_engine(target, step_draft, step_probes, step_options, keep_target=lane is None)
        for method in stepping:
            why = problem if method != "ar" and problem else engine.method_problem(method)
            _record(engines, (lane, method), engine, why)
    if "token_sd" in methods:
        problem = draft_problem(draft, target)
        engine = None if problem else VLLMEngine.load(target, draft=draft, speculative_tokens=draft_tokens, **options)
        _record(engines, (lane, "token_sd"), engine, problem)


def _record(engines: BenchEngines, key: tuple[str | None, str], engine, problem: str | None) -> None:
    if problem is None:
        engines.serving[key] = engine
    else:
        engines.unavailable[key] = problem


def _step_engine(target, draft, probes, options: dict, keep_target: bool):
    """(the step engine for ``draft``, why it drafts no steps). A draft that cannot draft
    steps (a head, ngram, another tokenizer) leaves the target alone, for ar, when
    ``keep_target``."""
    from semspec.prompts import MethodUnavailable
    from semspec.engine.step_engine import VLLMStepEngine

    try:
        return VLLMStepEngine.load(target, draft=draft, probes=probes, **options), None
    except MethodUnavailable as e:
        if not keep_target:
            return None, str(e)
        return VLLMStepEngine.load(target, draft="none", probes="none", **options), str(e)


def _probe_spec(probes: str | None, target, draft, cache_dir, directory: str) -> str | None:
    """``probes`` as the step engine loads them: forced ones ("accept", "reject",
    "const:P_T,P_D") saved as constant probes in ``directory``."""
    from semspec.components import resolve_components, step_draft_problem

    if probes not in FORCED_PROBES and not str(probes).startswith("const:"):
        return probes
    step_draft = resolve_components(target, draft, None)[0]
    if step_draft is None or step_draft_problem("semspec", step_draft) is not None:
        return probes  # the step engine refuses them itself, with the reason
    if probes in FORCED_PROBES:
        p_target, p_draft = FORCED_PROBES[probes]
    else:
        try:
            p_target, p_draft = (float(x) for x in probes[len("const:"):].split(","))
        except ValueError as e:
            raise ValueError(f"probes {probes!r}: expected const:P_T,P_D, e.g. const:0.7,0.9") from e
    from semspec.models.identity import DEFAULT_CACHE_DIR, models_cache
    from semspec.models.specs import DEFAULT_TARGET
    from semspec.probes import ProbePair
    from semspec.engine.step_engine import ModelFiles

    cache = models_cache(cache_dir) or DEFAULT_CACHE_DIR
    sizes = [ModelFiles.read(spec, cache).shape.hidden_size for spec in (target or DEFAULT_TARGET, step_draft)]
    return str(ProbePair.constant(p_target, p_draft, *sizes).save(directory))


def _transformers_model(spec, device: str, cache_dir, number_type: str) -> LoadedModel:
    from semspec.models.identity import models_cache
    from semspec.models.loaded import load_model

    return load_model(spec, device=device, cache_dir=models_cache(cache_dir), dtype=getattr(torch, number_type))


def _load_assistant(engines: BenchEngines, target, draft, device: str, cache_dir, number_type: str) -> None:
    """hf_assisted's draft: the step engine's draft model (a head or ngram has no model
    transformers can run)."""
    from semspec.components import resolve_components, same_tokenizer
    from semspec.head import resolve_head
    from semspec.types import NGRAM_DRAFT

    spec = resolve_components(target, draft, None)[0]
    if spec is None:
        engines.assistant_problem = "no draft model loaded"
    elif spec == NGRAM_DRAFT:
        engines.assistant_problem = "ngram is vLLM's prompt lookup: no model for transformers to assist with"
    elif resolve_head(spec) is not None:
        engines.assistant_problem = "a draft head drafts only in vLLM's token_sd (it reads the target's states)"
    else:
        model = _transformers_model(spec, device, cache_dir, number_type)
        if same_tokenizer(engines.target.tokenizer, model.tokenizer):
            engines.assistant = model
        else:
            engines.assistant_problem = "needs a draft with the target's tokenizer"

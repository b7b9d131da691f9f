"""The engine: loaded models + probes, and one ``generate`` for every method.

    engine = Engine.load()                      # embedded SmolLM2 (+ embedded draft/probes if shipped)
    engine = Engine.load(target, draft, probes)  # model specs (see semspec.models), probe dir
    result = engine.generate("What is 2+2?", GenerationConfig(method="ar"))
    for done in engine.generate_many(prompts, GenerationConfig(), batch_size=16):
        done.key, done.result, done.error         # in the order the prompts finish

``generate`` is ``generate_many`` over one prompt: one code path, continuous batching
(``semspec.scheduler``) over the batched runner (``semspec.runner``).

No I/O happens here beyond model loading: no database, no queue, no printing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Iterable, Iterator

from .head import load_draft
from .models import DEFAULT_TARGET, LoadedModel, load_model, models_cache, pick_dtype
from .probes import ProbePair, resolve_probes
from .components import MEASURED_DRAFT_COST, METHOD_NEEDS, resolve_components, same_tokenizer
from .scheduler import DEFAULT_MAX_PREFILL_TOKENS, PassStats, Runners, Scheduler
from .prompts import MethodUnavailable, PromptError
from .sequence import METHOD_CLASSES, Sequence
from .steps import detect_think_end
from .types import (DEFAULT_MAX_STEP_TOKENS, DEFAULT_STEP_DELIMITER, METHODS, Finished, GenerationConfig,
                    GenerationResult, Request, as_requests)

__all__ = ["Engine", "Finished", "MethodUnavailable", "PromptError", "Request"]


class Engine:
    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, probes: ProbePair | None = None,
                 unavailable: dict[str, str] | None = None):
        """``unavailable``: component ("draft", "probes") -> why it did not load; the methods
        that need it are refused with that reason, the others run."""
        self.target = target
        self.draft = draft
        self.probes = probes
        self.unavailable = dict(unavailable or {})
        self.same_tokenizer = draft is not None and same_tokenizer(target.tokenizer, draft.tokenizer)
        if probes is not None:
            if draft is None:
                raise ValueError("probes were given without a draft model")
            probes.target.check_model(target)
            probes.draft.check_model(draft)
            probes.target.to(target.device)
            probes.draft.to(draft.device)

    @classmethod
    def load(
        cls,
        target: str | None = None,
        draft: str | None = None,
        probes: str | None = None,
        device: str = "auto",
        cache_dir: str | os.PathLike | None = None,
        dtype: str = "auto",
        batch_size: int = 1,
    ) -> "Engine":
        """Load from specs. ``cache_dir`` is the service's cache root; converted models go
        to ``cache_dir/models`` (default ``~/.cache/semjobs/models``). ``dtype`` "auto"
        picks the number type that measures fastest for ``batch_size`` sequences in flight
        (``semspec.models.pick_dtype``); "float32" / "bfloat16" force one.

        Defaults: ``target=None`` is the embedded SmolLM2. With the embedded target,
        ``draft=None`` loads its default draft (``default_draft``) and ``probes=None`` the
        probes shipped for that draft (else none). ``draft="none"`` / ``probes="none"`` load none. A
        draft spec naming a draft head (``embedded:smollm2-135m-head``, or a directory with
        ``head.json``) loads it onto the target (``semspec.head``).

        Only the target must load: a draft or probes that cannot are left out, with the
        reason in ``unavailable``, so ``ar`` runs and the methods that need them are refused
        with that reason (``method_problem``)."""
        model_cache = models_cache(cache_dir)
        dt = pick_dtype(device, batch_size, dtype)
        t = load_model(target, device=device, cache_dir=model_cache, dtype=dt)
        draft, probes = resolve_components(target, draft, probes)
        d = p = None
        unavailable: dict[str, str] = {}
        try:
            d = load_draft(draft, t, device=device, cache_dir=model_cache, dtype=dt) if draft else None
        except Exception as e:  # noqa: BLE001 -- any failure is the draft's, reported per method
            unavailable["draft"] = f"the draft {draft!r} could not load: {type(e).__name__}: {e}"
        try:
            p = ProbePair.load(resolve_probes(probes), t, d, name=str(probes)) if probes and d else None
        except Exception as e:  # noqa: BLE001
            unavailable["probes"] = f"the probes {probes!r} could not load: {type(e).__name__}: {e}"
        return cls(t, d, p, unavailable)

    def calibration_models(self):
        """The pair as probe calibration samples and reads it (``semspec.calibration``), with
        transformers' forward."""
        from .calibration.transformers_models import TransformersModels

        return TransformersModels(self.target, self.draft)

    def method_problem(self, method: str) -> str | None:
        """Why ``method`` cannot run on this engine (a sentence naming the cause and the
        fix), or None when it can."""
        if method not in METHOD_NEEDS:
            return f"unknown method {method!r}; one of {', '.join(METHODS)}"
        loaded = {"draft": self.draft, "probes": self.probes}
        for need in METHOD_NEEDS[method]:
            if loaded[need] is None:
                why = self.unavailable.get(need) or self.unavailable.get("draft") or "none was configured"
                return f"method {method!r} needs {'a draft model' if need == 'draft' else 'probes'}: {why}"
        return None

    @functools.cached_property
    def think_end_marker(self) -> str | None:
        """The target's end-of-thinking marker, if it has one (looked up once: reading a
        large vocabulary costs tens of milliseconds)."""
        return detect_think_end(self.target.tokenizer)

    @functools.cached_property
    def draft_cost(self) -> float | None:
        """One draft pass in target decoding passes (``GenerationConfig.draft_cost`` when the
        caller leaves it unset): measured for the embedded pairs, else estimated."""
        if self.draft is None:
            return None
        if self.target.spec == DEFAULT_TARGET and self.draft.spec in MEASURED_DRAFT_COST:
            return MEASURED_DRAFT_COST[self.draft.spec]
        return self.draft.weights_per_pass / self.target.weights_per_pass

    @property
    def identities(self) -> dict[str, str]:
        """What made an output: each model's and probe's identity, the number type the models
        ran in (bfloat16 and float32 give different greedy text) and the engine."""
        ids = {"target": str(self.target.identity)}
        if self.draft is not None:
            ids["draft"] = str(self.draft.identity)
        if self.probes is not None:
            ids.update(self.probes.identities())
        ids["dtype"] = str(self.target.dtype).removeprefix("torch.")
        ids["engine"] = "embedded"
        return ids

    def new_sequence(self, messages: list[dict] | str, config: GenerationConfig, runners: Runners) -> Sequence:
        """The decoding state of one prompt on ``runners``' models (the scheduler drives it)."""
        if config.method not in METHODS:
            raise ValueError(f"unknown method {config.method!r}; one of {', '.join(METHODS)}")
        return METHOD_CLASSES[config.method](self, messages, self.resolve(config), runners)

    def resolve(self, config: GenerationConfig) -> GenerationConfig:
        """``config`` with its unset step rule filled in (the probes' calibration, else the
        defaults: every method gets the same rule, so their step logs compare) and the
        device's ``draft_max_batch`` and the draft's ``draft_cost``."""
        rule = {"step_delimiter": DEFAULT_STEP_DELIMITER, "max_step_tokens": DEFAULT_MAX_STEP_TOKENS}
        if self.probes is not None:
            rule.update(self.probes.step_rule())
        # drafting in a batch measured slower than the target alone on a CPU (docs/batching.md)
        rule["draft_max_batch"] = 1 if self.target.device.type == "cpu" else 0
        rule["draft_cost"] = self.draft_cost
        unset = {k: v for k, v in rule.items() if getattr(config, k) is None}
        return dataclasses.replace(config, **unset) if unset else config

    def generate_many(self, prompts: Iterable, config: GenerationConfig | None = None, batch_size: int = 8,
                      max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
                      stats: PassStats | None = None, share_prefixes: bool = True) -> Iterator[Finished]:
        """Decode up to ``batch_size`` prompts at once, yielding a :class:`Finished` (key,
        result or error) as each one ends. ``prompts``: texts, message lists or
        :class:`Request` (with a config and key of its own); read lazily, one as each slot
        frees. A prompt that fails (bad input, context overflow) fails alone. ``stats``,
        when given, is filled with the counts of the passes run (``PassStats``).
        ``share_prefixes``: prompts that begin alike copy each other's cached prefix
        (``semspec.scheduler``); off, each is prefilled in full."""
        yield from Scheduler(self, batch_size, max_prefill_tokens, stats=stats,
                             share_prefixes=share_prefixes).run(as_requests(prompts), config or GenerationConfig())

    def generate(self, messages: list[dict] | str, config: GenerationConfig | None = None) -> GenerationResult:
        """One prompt: ``generate_many`` with a batch of one; errors are raised."""
        (done,) = self.generate_many([messages], config, batch_size=1)
        if done.error is not None:
            raise done.error
        return done.result

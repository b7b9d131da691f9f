"""SemanticSpec on vLLM: the step-level methods (``semspec.stepwise``) over two vLLM engines.

    engine = VLLMStepEngine.load()                # the embedded target, its draft and probes
    for done in engine.generate_many(prompts, GenerationConfig(method="semspec"), batch_size=32):
        done.key, done.result, done.error

The target and the draft each run in a vLLM engine of their own in this process (the paper's
code does the same with two SGLang engines). Each engine stores the hidden states its probe
reads (``semspec.engine.states``), in its paged KV cache, so that a verification returns the
target's states over the drafted step, and a read of a drafted step the draft's. A loop here
keeps up to ``batch_size`` prompts' programs in flight: every call a program yields becomes a
request of its model's engine, every finished request's reply resumes its program, and each
engine takes one step per turn while it has requests: vLLM batches whatever calls are in
flight, with prefix caching doing the KV reuse across a prompt's calls.

No I/O happens here beyond model loading.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from semspec.components import EMBEDDED_DRAFT, resolve_components, same_tokenizer, step_draft_problem
from semspec.doom import DoomRule
from semspec.intake import Intake
from semspec.models.identity import DEFAULT_CACHE_DIR, ModelIdentity, models_cache
from semspec.models.specs import DEFAULT_TARGET, model_directory, model_source
from semspec.adaptive import JobExperience, LiveCosts, Meter
from semspec.probes import ProbePair, pool, resolve_probes
from semspec.prompts import MethodUnavailable, judge_prompt, prompt_ids
from semspec.repetition import vllm_detection
from semspec.stepwise import TARGET, WRITE_PHASE, Call, ModelFacts, Reply, SemSpecProgram, StepJudgeProgram, StepProgram
from semspec.steps import detect_think_end
from semspec.types import (DEFAULT_MAX_STEP_TOKENS, DEFAULT_STEP_DELIMITER, DRAFTING_FIELDS, METHODS,
                           VLLM_STEP_METHODS, Abort, Cancelled, Finished, GenerationConfig)
from semspec.engine import reduced_vocab_plugin
from semspec.engine.head_plugin import register
from semspec.engine.engine_args import parameter_count, shares_by_size
from semspec.engine.token_engine import (configure_process, engine_arguments, kv_budget_gb, model_files, runs_on_cpu,
                                         start_engine)
from semspec.engine.speculation import draft_problem, speculative_config
from semspec.engine.states import STATES, STATES_FROM, final_norm

log = logging.getLogger(__name__)
STEP_METHODS = {"ar": StepProgram, "semspec": SemSpecProgram, "step_judge": StepJudgeProgram}
# A drafted token's cost in target tokens on vLLM, the adaptive rule's draft_cost, measured at
# batch 1 for the embedded layer draft: 0.20 since its LM head runs over its 8,192 tokens only
# (0.28 before; docs/benchmarks.md, "Defaults chosen by measurement"), not the 0.14 of its weights, as an engine step costs the
# same fixed overhead whatever the model. Other pairs get the ratio of the weights a pass reads,
# which leaves that overhead out.
VLLM_DRAFT_COST = {EMBEDDED_DRAFT: 0.20}
# The draft's share of the KV cache budget: its cache per token is a few of the target's layers.
DRAFT_KV_SHARE = 0.25
# token_draft naming no token-level speculation of the target's own writing
NO_TOKEN_DRAFT = "none"


def _comparable(value: Any) -> Any:
    """A config value as a key: 0 and 0.0 alike (a job's JSON may give either), a dict by its items."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value


@dataclass(frozen=True)
class ModelShape:
    """What a probe checks of the model it reads (``Probe.check_model``)."""

    identity: ModelIdentity
    hidden_size: int
    num_layers: int
    device: str = "cpu"  # where the probe runs: it reads pooled states the engine copied out


@dataclass
class Served:
    """A model in a vLLM engine (storing the states its probe reads, when it has one): what
    programs and pooling need."""

    llm: Any
    facts: ModelFacts
    shape: ModelShape
    norm: tuple[torch.Tensor, float] | None  # the final norm's (weight, eps), when the probe reads the last layer
    layer: int | None = None  # the hidden_states index whose states it stores
    steps: int = 0  # engine steps taken
    in_flight: dict[str, "_Live"] = field(default_factory=dict)
    # seconds per token of its writing calls (target, writer) or drafting calls (draft), over
    # every sequence's: the adaptive rule's measured costs (semspec.adaptive.LiveCosts)
    meter: Meter = field(default_factory=Meter)
    token_draft: ModelIdentity | None = None  # what it speculates tokens with, when it does

    def features(self, rows: torch.Tensor, pooling: str = "mean") -> torch.Tensor:
        """A step's states ``[n, hidden]`` pooled as ``semspec.probes.pool`` pools them."""
        if self.norm is not None:
            rows = final_norm(rows, *self.norm)
        return pool(rows[None], None, pooling)[0]


@dataclass
class _Live:
    """A prompt in flight: its program, and the call it waits on."""

    key: Any
    program: StepProgram
    gen: Any
    call: Call | None = None  # of a batch of calls (``stepwise.side_by_side``): the first
    served: Served | None = None  # the engine serving the call
    alone: bool = True  # whether the call was made while the sequence could draft (``_alone``)
    call_t0: float = 0.0
    call_step: int = 0
    calls: int = 0
    batch: list[Reply | None] | None = None  # a batch of calls' replies so far, in the calls' order
    awaited: dict[str, int] = field(default_factory=dict)  # a batch's requests in flight -> their place


def _final_norm_weight(model_dir: Path) -> torch.Tensor:
    from safetensors import safe_open

    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            if "model.norm.weight" in f.keys():
                return f.get_tensor("model.norm.weight")
    raise ValueError(f"{model_dir} holds no model.norm.weight: its last layer's states cannot be normed")


@dataclass
class ModelFiles:
    """A model directory vLLM serves from, as read before an engine starts (so that a probe
    that does not fit the model fails before minutes of loading)."""

    spec: str
    directory: Path
    tokenizer: Any
    config: Any
    eos: set[int]
    shape: ModelShape

    @classmethod
    def read(cls, spec: str, cache: Path) -> "ModelFiles":
        directory, identity = model_source(spec, cache)
        tokenizer, config, eos = model_files(directory)
        shape = ModelShape(identity, int(config.hidden_size), int(config.num_hidden_layers))
        return cls(str(spec), Path(directory), tokenizer, config, eos, shape)

    def serve(self, layer: int | None, kv_cache_gb: float | None, device: str, dtype: str, batch_size: int,
              compile: bool, seed: int, speculation: dict | None = None, engine_args: dict | None = None,
              gpu_share: float | None = None) -> Served:
        """A vLLM engine of this model, storing ``layer``'s states (a ``hidden_states`` index,
        negative from the end) when given, else speculating with ``speculation`` (vLLM's
        ``speculative_config``) when given; ``engine_args``: vLLM's own arguments over semjobs',
        ``gpu_share``: its gpu_memory_utilization (``engine_arguments``' ``user`` and
        ``gpu_memory_utilization``). A model with a reduced vocabulary (the layer draft) runs
        its LM head over that vocabulary only (``reduced_vocab_plugin``)."""
        from vllm import EngineArgs

        if layer is not None:
            index = layer + self.shape.num_layers + 1 if layer < 0 else layer
            if not 0 <= index <= self.shape.num_layers:
                raise ValueError(f"{self.spec} has {self.shape.num_layers} layers: no hidden_states[{layer}]")
            layer = index
        user = reduced_vocab_plugin.engine_args(self.directory, self.config, engine_args)
        if user is not engine_args:  # our class of its architecture, made known to vLLM here
            register()
        # logprobs after the allowed-token mask: a judge's over the ten digits alone
        args = EngineArgs(**engine_arguments(self.directory, device, dtype, batch_size, kv_cache_gb, compile, seed,
                                             speculative_config=speculation, states_layer=layer, user=user,
                                             gpu_memory_utilization=gpu_share),
                          logprobs_mode="processed_logprobs")
        llm = start_engine(args)
        norm = None
        if layer == self.shape.num_layers:
            norm = (_final_norm_weight(self.directory), float(getattr(self.config, "rms_norm_eps", 1e-6)))
        facts = ModelFacts(self.tokenizer, frozenset(self.eos), int(llm.model_config.max_model_len))
        return Served(llm, facts, self.shape, norm, layer)


def read_step_models(target: str | None, draft: str | None, probes: str | None, cache: Path,
                     with_probes: bool = True) -> tuple[ModelFiles, ModelFiles | None, ProbePair | None]:
    """What ``VLLMStepEngine.load`` reads before it starts an engine, where the defaults
    resolve (``resolve_components``): the target's files, the draft's and the probes checked
    against both (None where not named, or not ``with_probes``). Models are converted into
    ``cache`` where they come so. A draft the step methods cannot use, or of another
    tokenizer, is refused (MethodUnavailable); a probe that does not fit its model fails here."""
    draft, probes = resolve_components(target, draft, probes)
    problem = step_draft_problem("semspec", draft)
    if problem is not None:
        raise MethodUnavailable(problem)
    t = ModelFiles.read(target or DEFAULT_TARGET, cache)
    d = ModelFiles.read(draft, cache) if draft else None
    if d is not None and not same_tokenizer(t.tokenizer, d.tokenizer):
        raise MethodUnavailable("the step-level methods on vLLM need a draft with the target's tokenizer")
    pair = None
    if with_probes and d is not None and probes:
        pair = ProbePair.load(resolve_probes(probes), t.shape, d.shape, name=str(probes))
    return t, d, pair


def gpu_shares(engines: dict[str, ModelFiles | None], engine_args: dict[str, dict]) -> dict[str, float]:
    """Each engine's gpu_memory_utilization where the step engines share a GPU (all of a
    process's engines start on its first one): vLLM's default fraction split among them by
    their parameter counts (``engine_args.shares_by_size``), those whose ``engine_args`` (by
    engine: target, draft, writer) set one keeping theirs. ``engines``: None for one not started."""
    sizes = {name: parameter_count(files.directory) for name, files in engines.items() if files is not None}
    return shares_by_size(sizes, engine_args)


def writes_own_tokens(target: str | None, draft: str | None, token_draft: str | None) -> bool:
    """Whether the step engines of a job start the writer (the target speculating tokens in its
    own writing with ``token_draft``): beside a draft (``resolve_components``'), with a token
    draft vLLM can speculate with on the target."""
    return bool(draft) and token_draft != NO_TOKEN_DRAFT and draft_problem(token_draft, target) is None


def step_engine_models(target: str | None, draft: str | None, probes: str | None,
                       cache_dir: str | os.PathLike | None = None, token_draft: str | None = None) -> dict[str, Path]:
    """The model directory of each engine ``VLLMStepEngine.load`` starts for a job with these
    specs, by engine (target, draft and, where it writes its own tokens, the writer); empty
    where they name no draft that drafts steps (the step methods then run no draft). For a
    process that holds them beside other engines on one GPU (``semjobs.worker.gpu_memory``)."""
    cache = models_cache(cache_dir) or DEFAULT_CACHE_DIR
    draft, _ = resolve_components(target, draft, probes)
    if not draft or step_draft_problem("semspec", draft) is not None:
        return {}
    target_dir = model_directory(target or DEFAULT_TARGET, cache)[0]
    models = {"target": target_dir, "draft": model_directory(draft, cache)[0]}
    return {**models, "writer": target_dir} if writes_own_tokens(target, draft, token_draft) else models


class VLLMStepEngine:
    def __init__(self, target: Served, draft: Served | None, probes: ProbePair | None, dtype: str, version: str,
                 threads: int, draft_cost: float | None, writer: Served | None = None, doom: DoomRule | None = None):
        """``writer``: the target again, speculating tokens, for the drafting methods' own
        writing (``token_speculation``); ``doom``: a doom rule of the length kind (``load``)."""
        self.target = target
        self.doom = doom
        self.draft = draft
        self.writer = writer
        self.probes = probes
        self.dtype = dtype
        self.version = version
        self.threads = threads
        self.draft_cost = draft_cost
        self.think_end_marker = detect_think_end(target.facts.tokenizer)
        self.on_cpu = target.llm.vllm_config.device_config.device_type == "cpu"
        self._next_id = 0
        self.verify_meter = Meter()  # seconds per verification (or judgement) of a drafted step
        self.experiences: dict[tuple, JobExperience] = {}  # by kind of job (DRAFTING_FIELDS)

    @classmethod
    def load(cls, target: str | None = None, draft: str | None = None, probes: str | None = None,
             device: str = "auto", cache_dir: str | os.PathLike | None = None, dtype: str = "auto",
             batch_size: int = 32, kv_cache_gb: float | None = None, compile: bool = False,
             seed: int = 0, layers: dict[str, int] | tuple | None = None, token_draft: str | None = None,
             draft_tokens: int = GenerationConfig.draft_tokens, engine_args: dict | None = None,
             draft_engine_args: dict | None = None, doom_rule: str | os.PathLike | None = None) -> "VLLMStepEngine":
        """The target and its draft in two vLLM engines, each storing the layer its probe
        reads (defaults: the embedded target, its layer draft and their probes,
        ``semspec.components.resolve_components``). ``kv_cache_gb``: the target's KV budget
        (None: ``kv_budget_gb``'s default); the draft gets ``DRAFT_KV_SHARE`` of it more.
        Without probes semspec is refused, without a draft step_judge too. ``layers``
        ({"target": i, "draft": j}, transformers' ``hidden_states`` indices, negative from the
        end, or its items): the layers stored instead of the probes' (which are then not
        loaded), for probe calibration to read the states decoding reads.
        ``token_draft``: what the target's own writing in the drafting methods speculates with,
        ``draft_tokens`` tokens per verification, in a third engine (the writer): a draft head
        or ngram, as for token_sd (``semspec.engine.speculation``; default: the embedded
        target's head; "none": the target writes alone). ``engine_args``: vLLM's own arguments for
        the target and the writer, ``draft_engine_args`` for the draft (``semspec.engine.engine_args``);
        on a GPU the engines share its memory by their sizes (``gpu_shares``) unless they say.
        ``doom_rule``: a ``semspec.doom.DoomRule`` file calibrated on this target; the step methods
        read no per-token log-probabilities, so they apply a rule of the length kind only (an
        infinite threshold: every sample stopped at its ``min_tokens``) and no other."""
        configure_process()
        import vllm

        threads = torch.get_num_threads()
        cache = models_cache(cache_dir) or DEFAULT_CACHE_DIR
        calibrating = layers is not None  # probe calibration reads states: no probes, no writer
        t, d, pair = read_step_models(target, draft, probes, cache, with_probes=not calibrating)
        doom = DoomRule.load(doom_rule) if doom_rule else None
        if doom is not None:
            doom.check_target(str(t.shape.identity))  # before the minutes vLLM takes to start
            if not doom.caps_length:
                log.warning("the doom rule %s reads log-probabilities, which the step methods do not have: "
                            "their samples are not stopped by it", doom_rule)
                doom = None
        draft = d.spec if d is not None else None
        if pair is not None:
            layers = {"target": pair.target.layer, "draft": pair.draft.layer}
        layers = dict(layers or {})
        options = dict(device=device, dtype=dtype, batch_size=batch_size, compile=compile, seed=seed)
        kv_gb = kv_budget_gb(kv_cache_gb, device)
        writes = d is not None and not calibrating and writes_own_tokens(target, draft, token_draft)
        roles = {"target": engine_args or {}, "draft": draft_engine_args or {}, "writer": engine_args or {}}
        shares = gpu_shares({"target": t, "draft": d, "writer": t if writes else None}, roles) \
            if d is not None and not runs_on_cpu(device) else {}
        served_t = t.serve(layers.get("target"), kv_gb, **options, engine_args=engine_args,
                           gpu_share=shares.get("target"))
        served_d = d.serve(layers.get("draft"), None if kv_gb is None else kv_gb * DRAFT_KV_SHARE, **options,
                           engine_args=draft_engine_args, gpu_share=shares.get("draft")) if d else None
        writer = None
        if writes:
            spec, identity = speculative_config(token_draft, target, draft_tokens, t.directory,
                                                t.shape.identity.sha256, cache)
            writer = t.serve(None, kv_gb, **options, speculation=spec, engine_args=engine_args,
                             gpu_share=shares.get("writer"))
            writer.token_draft = identity
        cost = VLLM_DRAFT_COST.get(str(draft)) if target in (None, DEFAULT_TARGET) else None
        if d is not None and cost is None:  # a decoding pass is memory-bound: the weights it reads
            cost = (d.config.num_hidden_layers * d.config.hidden_size ** 2) / (
                t.config.num_hidden_layers * t.config.hidden_size ** 2)
        engine = cls(served_t, served_d, pair, str(served_t.llm.model_config.dtype).removeprefix("torch."),
                     vllm.__version__, threads, cost, writer, doom)
        # a few tokens through every kind of call now: a model vLLM loads but cannot run fails
        # the load, not every item, and the first item does not pay the first passes' set-up
        method = "semspec" if pair else "step_judge" if d else "ar"
        engine.generate("Hi", GenerationConfig(method=method, max_new_tokens=8, max_step_tokens=4, draft_max_batch=0))
        if writer is not None:  # which the probes may not have rejected a step for
            engine.generate("Hi", GenerationConfig(method=method, max_new_tokens=8, max_step_tokens=4,
                                                   draft_max_batch=0, adaptive=False, tau=1.0))
        engine.reset_meters()  # first passes pay set-up no later pass pays
        return engine

    # ------------------------------------------------------------------ what it serves
    @property
    def identities(self) -> dict[str, str]:
        ids = {"target": str(self.target.shape.identity)}
        if self.draft is not None:
            ids["draft"] = str(self.draft.shape.identity)
        if self.probes is not None:
            ids.update(self.probes.identities())
            if (floor := self.probes.floor()) is not None:  # what greedy jobs without a tau of their own apply
                ids["greedy_floor"] = f"{floor:g}"
        if self.writer is not None:
            ids["token_draft"] = str(self.writer.token_draft)
        ids.update(dtype=self.dtype, engine=f"vllm {self.version}")
        if self.doom is not None:
            ids["doom_rule"] = self.doom.identity
        return ids

    def method_problem(self, method: str) -> str | None:
        if method not in METHODS:
            return f"unknown method {method!r}; one of {', '.join(METHODS)}"
        if method not in STEP_METHODS:
            return f"method {method!r} does not run on vLLM at step level (it runs {', '.join(STEP_METHODS)})"
        if method != "ar" and self.draft is None:
            return f"method {method!r} needs a draft model: none was loaded"
        if method == "semspec" and self.probes is None:
            return "method 'semspec' needs probes: none were loaded"
        return None

    def resolve(self, config: GenerationConfig) -> GenerationConfig:
        """``config`` with its unset step rule filled in (the probes' calibration, else the
        defaults: every method gets the same rule, so their step logs compare), its floor on
        p_T (greedy, the probes' calibrated one; sampled, none: GenerationConfig.tau), the
        draft's cost for the adaptive rule, and
        the batch pause: on a CPU drafting pauses beside another sequence (measured slower than
        the target alone from 8 in flight up, docs/benchmarks.md, "Defaults chosen by measurement"), on
        a GPU never."""
        rule = {"step_delimiter": DEFAULT_STEP_DELIMITER, "max_step_tokens": DEFAULT_MAX_STEP_TOKENS, "tau": 0.0,
                "draft_max_batch": 1 if self.on_cpu else 0, "draft_cost": self.draft_cost}
        if self.probes is not None:
            rule.update(self.probes.step_rule())
            if config.temperature == 0 and (floor := self.probes.floor()) is not None:
                rule["tau"] = floor
        unset = {k: v for k, v in rule.items() if getattr(config, k) is None}
        return dataclasses.replace(config, **unset) if unset else config

    def new_program(self, prompt: Any, config: GenerationConfig, in_flight) -> StepProgram:
        problem = self.method_problem(config.method)
        if problem is not None:
            raise MethodUnavailable(problem)
        cfg = self.resolve(config)
        # the engine's measured costs, unless the job fixed them
        live = self.live_costs(cfg) if config.draft_cost is None and cfg.method in VLLM_STEP_METHODS else None
        t = self.target.facts
        ids = prompt_ids(t.tokenizer, prompt, cfg.chat_template_kwargs, t.max_context)
        think_end = self.think_end_marker if cfg.think_end == "auto" else (cfg.think_end or None)
        identities = self.identities
        if not self._speculates(cfg):  # the writer takes no part in this job's text
            identities.pop("token_draft", None)
        if cfg.method == "ar":
            program = StepProgram(ids, cfg, t, think_end, identities, in_flight)
        elif cfg.method == "step_judge":
            program = StepJudgeProgram(ids, cfg, t, think_end, identities, in_flight, draft=self.draft.facts,
                                       suffix=self.judge[0], digits=self.judge[1], live_costs=live)
        else:
            program = SemSpecProgram(ids, cfg, t, think_end, identities, in_flight, draft=self.draft.facts,
                                     probes=self.probes, pool_states=self._features, live_costs=live)
        if self.doom is not None and cfg.stop_doomed and cfg.temperature > 0:
            program.doom_cap = self.doom.min_tokens
        return program

    def reset_meters(self) -> None:
        for s in (self.target, self.writer, self.draft):
            if s is not None:
                s.meter = Meter()
        self.verify_meter = Meter()
        self.experiences = {}

    def live_costs(self, cfg: GenerationConfig) -> LiveCosts:
        """The running engine's measured costs for a job of ``cfg``: its writing as routed; and
        what earlier jobs of its kind learned of their drafts."""
        writes = self.writer if self._speculates(cfg) else self.target
        kind = tuple(_comparable(getattr(cfg, name)) for name in DRAFTING_FIELDS)
        return LiveCosts(write=writes.meter, draft=self.draft.meter, verify=self.verify_meter,
                         experience=self.experiences.setdefault(kind, JobExperience()))

    @functools.cached_property
    def judge(self) -> tuple[list[int], tuple[int, ...]]:
        """step_judge's question after a step and its ten digit tokens (read once)."""
        suffix, digits = judge_prompt(self.target.facts.tokenizer)
        return suffix, tuple(digits)

    def _features(self, model: str, rows: torch.Tensor) -> torch.Tensor:
        return (self.target if model == TARGET else self.draft).features(rows)

    # ------------------------------------------------------------------ decoding
    def generate_many(self, prompts: Iterable, config: GenerationConfig | None = None,
                      batch_size: int = 8) -> Iterator[Finished]:
        """``semspec.engine.token_engine.VLLMEngine.generate_many``'s contract: up to ``batch_size``
        prompts in flight, read lazily; a bad prompt fails alone; an Abort ends its request at
        once."""
        torch.set_num_threads(self.threads)  # vLLM's CPU attention plans for the loading thread's count
        default = config or GenerationConfig(method="semspec")
        intake = Intake(prompts)
        live: dict[Any, _Live] = {}
        served = [s for s in (self.target, self.writer, self.draft) if s is not None]
        try:
            while True:
                fresh: list[_Live] = []
                while (req := intake.next(room=len(live) < batch_size)) is not None:
                    if isinstance(req, Abort):
                        item = live.pop(req.key, None)
                        if item is not None:
                            fresh = [f for f in fresh if f is not item]
                            self._drop(item)
                            spent = len(item.program.ids) - item.program.prompt_len
                            yield Finished(req.key, None, Cancelled(f"request {req.key!r} aborted", spent))
                        continue
                    try:
                        program = self.new_program(req.prompt, req.config or default, lambda: len(live))
                    except Exception as e:  # noqa: BLE001 -- whatever one request raises (a bad prompt or
                        yield Finished(req.key, None, e)  # config, a template that throws) fails it alone
                        continue
                    live[req.key] = _Live(req.key, program, program.program())
                    fresh.append(live[req.key])
                # started once all are in: each sees how many share the batch (the pause)
                while fresh:
                    item = fresh.pop(0)
                    if (done := self._resume(item, None)) is not None:
                        del live[item.key]
                        yield done
                if not live:
                    if intake.exhausted:
                        return
                    continue
                for s in served:
                    if not s.in_flight:
                        continue
                    outputs = s.llm.step()
                    s.steps += 1
                    for out in outputs:
                        if not out.finished or out.request_id not in s.in_flight:
                            continue
                        item = s.in_flight.pop(out.request_id)
                        reply = self._reply(out)
                        if item.batch is not None:
                            item.batch[item.awaited.pop(out.request_id)] = reply
                            if item.awaited:
                                continue  # the batch's other requests are still running
                            reply, item.batch = item.batch, None
                        if (done := self._resume(item, reply)) is not None:
                            del live[item.key]
                            yield done
        finally:  # the caller stopped early (or failed): free vLLM of what is left
            for item in live.values():
                self._drop(item)

    def _resume(self, item: _Live, reply: Reply | list[Reply] | None) -> Finished | None:
        """Send ``reply`` (a batch of calls': the list of theirs) to the program and submit its
        next call; its Finished when it ends."""
        if reply is not None:
            served = item.served
            c = item.program.counters
            seconds = time.perf_counter() - item.call_t0
            c.phase_seconds[item.call.phase] = c.phase_seconds.get(item.call.phase, 0.0) + seconds
            if item.alone and not isinstance(reply, list):  # what drafting is weighed against, where it is
                self._measure(item.call, served, seconds, len(reply.tokens))  # (a batch's cost is no one call's)
            if item.call.model == TARGET:
                c.target_forward_passes += served.steps - item.call_step
            else:
                c.draft_forward_passes += served.steps - item.call_step
        try:
            call = item.gen.send(reply) if reply is not None else next(item.gen)
        except StopIteration:
            return Finished(item.key, item.program.result())
        except Exception as e:  # noqa: BLE001 -- a program's failure fails its item alone
            return Finished(item.key, None, e)
        try:
            self._submit(item, call)
        except Exception as e:  # noqa: BLE001 -- vLLM refused the request (longer than its context, say)
            self._drop(item)  # a batch's requests already handed over
            return Finished(item.key, None, e)
        return None

    @staticmethod
    def _reply(out: Any) -> Reply:
        completion = out.outputs[0]
        logprobs = None
        if completion.logprobs:  # the one token's: the scored tokens' (and the sampled one's)
            logprobs = {t: lp.logprob for t, lp in completion.logprobs[0].items()}
        return Reply(list(completion.token_ids), (out.kv_transfer_params or {}).get(STATES), logprobs)

    def _speculates(self, cfg: GenerationConfig) -> bool:
        """Whether a job of ``cfg`` has its own writing speculate tokens (on the writer)."""
        return self.writer is not None and cfg.token_speculation and cfg.method in VLLM_STEP_METHODS

    def _served(self, call: Call, program: StepProgram) -> Served:
        """The engine that serves ``call``: the writer for a drafting method's own writing
        (when it has one and the job speculates tokens), else the call's model's. Beside
        other sequences too: the writer drafts tokens only while few requests run in it
        (``token_engine.speculation_schedule``), and beside more writes as the target does,
        without the target's states engine's cost per step (2-core AMX host, 32 in flight,
        greedy: semspec 0.95x ar with those writes on the target, token_sd 1.04x; measured
        with ``semjobs bench --batch-size 4,32 --limit 32 --methods
        ar,token_sd,step_judge,semspec --temperature 0 --no-loglik``)."""
        if call.model != TARGET:
            return self.draft
        speculating = self._speculates(program.cfg) and call.phase == WRITE_PHASE
        return self.writer if speculating else self.target

    @staticmethod
    def _alone(program: StepProgram) -> bool:
        """Whether ``program``'s sequence may draft: few enough in flight (draft_max_batch)."""
        limit = program.cfg.draft_max_batch
        return not limit or program.in_flight() <= limit

    def _measure(self, call: Call, served: Served, seconds: float, tokens: int) -> None:
        """Book a finished call's seconds for the adaptive rule: per token written or drafted
        (a read of drafted states adds its seconds to the draft's, no token), per verification."""
        if call.phase == WRITE_PHASE:
            served.meter.observe(seconds, tokens)
        elif call.model != TARGET:
            served.meter.observe(seconds, 0 if call.states_from is not None else tokens)
        elif call.phase == "judge" or call.states_from is not None:  # a step's verification
            self.verify_meter.observe(seconds)
        elif call.phase == "verify":  # step_judge's token after a kept step: the same verification's
            self.verify_meter.observe(seconds, 0)

    def _submit(self, item: _Live, call: Call | list[Call]) -> None:
        """Hand ``call`` (or a batch of calls, one request each, on one model) to its engine."""
        if not isinstance(call, list):
            self._request(item, call)
            return
        item.batch, item.awaited = [None] * len(call), {}
        for place, one in enumerate(call):
            item.awaited[self._request(item, one)] = place
        item.call = call[0]  # their phase; and their engine, for the passes the batch took

    def _request(self, item: _Live, call: Call) -> str:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        cfg = item.program.cfg
        served = self._served(call, item.program)
        stop = [cfg.step_delimiter] + ([item.program.think_end] if item.program.think_end else [])
        extra = {"kv_transfer_params": {STATES_FROM: call.states_from}} if call.states_from is not None else None
        sampled = cfg.temperature > 0 and not call.scored  # a judge reads its scores greedily
        # a sequence's first request takes the job's seed, as ar's and token_sd's single request
        # does: one that drafts nothing writes their sample (the writer verifies by the
        # target's own draws), so a benchmark compares the methods on the same text; each
        # later request other numbers (apart from the acceptance coin's, seed + 1_000_003)
        seed = (cfg.seed + item.calls * 2_000_003) % 2**63
        params = SamplingParams(
            temperature=cfg.temperature if sampled else 0.0, top_p=cfg.top_p if sampled else 1.0,
            seed=seed if sampled and cfg.reproducible else None,
            max_tokens=call.max_tokens, stop_token_ids=sorted(served.facts.eos),
            stop=stop if call.stop_at_step_end else None, include_stop_str_in_output=True,
            detokenize=call.stop_at_step_end, output_kind=RequestOutputKind.FINAL_ONLY, extra_args=extra,
            # (logprob_token_ids would say it directly, but vLLM 0.32 returns nothing for it
            # on an engine that extracts states)
            allowed_token_ids=list(call.scored) or None, logprobs=len(call.scored) or None,
            # a write-ahead ends where its own tokens loop (stepwise.StepProgram.stop_loop finds it)
            **vllm_detection(call.stop_loops),
        )
        request_id = self.request_id()
        item.call, item.served, item.call_t0, item.call_step = call, served, time.perf_counter(), served.steps
        item.alone = self._alone(item.program)
        item.calls += 1
        served.llm.add_request(request_id, served.llm.renderer.render_cmpl([{"prompt_token_ids": call.ids}])[0],
                               params)
        served.in_flight[request_id] = item
        return request_id

    def request_id(self) -> str:
        """A request id no other request of these engines has (vLLM wants them unique)."""
        self._next_id += 1
        return str(self._next_id)

    def _drop(self, item: _Live) -> None:
        for s in (self.target, self.writer, self.draft):
            if s is None:
                continue
            for rid in [r for r, it in s.in_flight.items() if it is item]:
                del s.in_flight[rid]
                s.llm.abort_request([rid])

    def generate(self, messages: list[dict] | str, config: GenerationConfig | None = None):
        (done,) = self.generate_many([messages], config, batch_size=1)
        if done.error is not None:
            raise done.error
        return done.result

"""Run every method on the same prompts, interleaved prompt by prompt.

For each prompt, every method runs once (the method order rotates from prompt to prompt, so
that no method is always first after a switch) with the same seed and token limits; machine
noise therefore hits all methods alike. When sampling, ``ar`` runs a second time with other
seeds (label ``ar_2``) to measure the noise floor of answer agreement.

Timing: wall-clock around the whole call (prompt encoding, decoding and detokenizing included),
after one short untimed warm-up call per method. Quality passes (the target's log-likelihood
of every output) run after all timed runs and are not timed.

The engine methods decode on vLLM (``semspec.benchmark.engines``: ar, step_judge and semspec on
one step engine, token_sd on a speculating one). ``hf_assisted`` is transformers'
``generate(assistant_model=draft)`` with the same target, the step engine's draft (a
reduced-vocabulary draft runs its reduced LM head there too), sampling settings, EOS tokens
and token limit; its forward passes are counted with forward
hooks, and the assistant's generation settings are restored before every call (transformers
otherwise carries its adaptive number of assistant tokens over from call to call).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from semspec.answers import final_answer, reference_from
from semspec.assets import GSM8K_TEST
from semspec.prompts import encode_prompt
from semspec.quality import target_mean_loglik
from semspec.types import SAMPLING_TEMPERATURE, SAMPLING_TOP_P, GenerationConfig

if TYPE_CHECKING:
    from .engines import BenchEngines

DEFAULT_PROMPTS = str(GSM8K_TEST)  # GSM8K test split shipped with the engine (semspec/assets/gsm8k)
ALL_METHODS = ("ar", "token_sd", "hf_assisted", "step_judge", "semspec", "hf_generate")
DEFAULT_METHODS = ALL_METHODS[:5]  # hf_generate (transformers' plain generate, no draft) is opt-in
AR2_SEED_OFFSET = 100_003  # the second ar run's seeds: seed + prompt index + this


@dataclass
class BenchSettings:
    prompts: str = DEFAULT_PROMPTS
    limit: int = 10
    offset: int = 0
    methods: tuple[str, ...] = DEFAULT_METHODS
    taus: tuple[float | None, ...] | None = None  # None: semspec at its default setting only; a None tau: the probes' floor
    attempts: tuple[int, ...] | None = None  # semspec draft attempts per step; None: the default only
    candidates: tuple[int, ...] | None = None  # semspec candidate steps drafted side by side; None: the default
    ratio_floors: tuple[float, ...] | None = None  # semspec's p_T/p_D floor (the paper's rule); None: the default
    adaptive: tuple[bool, ...] | None = None  # semspec's adaptive speculation on/off; None: the default
    # semspec's own writing speculating tokens (GenerationConfig.token_speculation) on/off; None: the default
    token_speculation: tuple[bool, ...] | None = None
    temperature: float = SAMPLING_TEMPERATURE
    top_p: float = SAMPLING_TOP_P
    max_new_tokens: int = 256
    seed: int = 0
    step_delimiter: str | None = None  # None: the engine's (the probes' calibration, else a blank line)
    max_step_tokens: int | None = None  # None: the engine's default
    draft_tokens: int | None = None
    judge_threshold: int | None = None
    warmup: bool = True
    loglik: bool = True
    # further drafts run beside the main one on the same prompts, in the same run: each
    # drafting method once more per draft, labelled e.g. "token_sd@draft=smollm2-135m-head"
    compare_drafts: tuple[str, ...] = ()
    # the probes of each of compare_drafts, in their order (a draft without: its shipped ones)
    compare_probes: tuple[str, ...] = ()
    # vLLM's own engine arguments for the target's engines and the step engines' draft
    # (semspec.engine.engine_args), recorded with the results
    engine_args: dict[str, Any] = field(default_factory=dict)
    draft_engine_args: dict[str, Any] = field(default_factory=dict)


# methods that run on any draft (hf_assisted runs with the main draft only)
ENGINE_DRAFT_METHODS = ("token_sd", "step_judge", "semspec")


def draft_name(spec: str) -> str:
    """A short name for a draft spec, for labels: the embedded name or the directory's."""
    spec = str(spec)
    return spec.split(":", 1)[1] if spec.startswith("embedded:") else Path(spec).name or spec


# semspec's settings the bench crosses: GenerationConfig field -> its name in run labels
SEMSPEC_GRID = {"tau": "tau", "ratio_floor": "ratio_floor", "draft_attempts": "attempts",
                "draft_candidates": "candidates", "adaptive": "adaptive", "token_speculation": "token_sd"}


@dataclass
class MethodRun:
    label: str  # key in results: "ar", "ar_2", "semspec", "semspec@tau=0.3", ...
    method: str  # an engine method or "hf_assisted"
    knobs: dict[str, Any] = field(default_factory=dict)  # GenerationConfig fields set for this run
    seed_offset: int = 0
    default_setting: bool = True
    draft: str | None = None  # a spec of settings.compare_drafts; None: the main draft

    def meta(self) -> dict[str, Any]:
        d = {"method": self.method, "default_setting": self.default_setting, **self.knobs}
        if self.draft is not None:
            d["draft"] = self.draft
        return d


# --------------------------------------------------------------------------- prompts


def load_prompts(path: str | os.PathLike = DEFAULT_PROMPTS, limit: int | None = None, offset: int = 0) -> list[dict]:
    """JSONL lines ``offset .. offset+limit``: the prompt from ``question`` (GSM8K), ``prompt`` or
    ``messages`` (a chat, passed to the engine as is); the reference from GSM8K's ``answer``
    (after ``####``) or a ``reference`` field."""
    out: list[dict] = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i < offset or not line.strip():
                continue
            rec = json.loads(line)
            text = rec.get("question") or rec.get("prompt") or rec.get("messages")
            if not text:
                raise ValueError(f"{path}:{i + 1}: no 'question', 'prompt' or 'messages' field")
            ref = reference_from(rec["reference"] if rec.get("reference") is not None else rec.get("answer"))
            out.append({"id": str(rec.get("id", i)), "line": i, "prompt": text, "reference": ref})
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise ValueError(f"no prompts in {path} (offset {offset})")
    return out


# --------------------------------------------------------------------------- plan


def plan_runs(methods: tuple[str, ...] | list[str], taus, temperature: float,
              attempts=None, compare_drafts=(), ratio_floors=None,
              adaptive=None, token_speculation=None, candidates=None) -> list[MethodRun]:
    """The labelled runs: ``ar`` always (speed-ups are against it), ``ar_2`` when sampling,
    ``semspec`` once per combination of ``taus`` x ``ratio_floors`` x draft ``attempts`` x ``candidates`` x ``adaptive``
    x ``token_speculation`` (the engine's defaults are labelled plain ``semspec``, others by
    what differs, e.g. ``semspec@tau=0.1``, ``semspec@ratio_floor=0.6,attempts=3`` or
    ``semspec@token_sd=0``), and each drafting method
    at its defaults once more per draft of ``compare_drafts``."""
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(ALL_METHODS)}")
    defaults = GenerationConfig()
    for name, counts in (("draft attempts", attempts), ("candidates", candidates)):
        if any(int(k) < 1 for k in counts or ()):
            raise ValueError(f"{name} must be at least 1, not {min(int(k) for k in counts)}")
    grid = {"tau": [None if t is None else float(t) for t in taus or [defaults.tau]],  # None: the probes' floor
            "ratio_floor": [float(r) for r in ratio_floors or [defaults.ratio_floor]],
            "draft_attempts": [int(k) for k in attempts or [defaults.draft_attempts]],
            "draft_candidates": [int(k) for k in candidates or [defaults.draft_candidates]],
            "adaptive": [bool(a) for a in adaptive or [defaults.adaptive]],
            "token_speculation": [bool(a) for a in token_speculation or [defaults.token_speculation]]}
    runs = [MethodRun("ar", "ar")]
    if temperature > 0:
        runs.append(MethodRun("ar_2", "ar", seed_offset=AR2_SEED_OFFSET))
    for m in methods:
        if m == "ar":
            continue
        if m != "semspec":
            runs.append(MethodRun(m, m))
            continue
        for values in itertools.product(*grid.values()):
            knobs = dict(zip(grid, values))
            odd = [f"{SEMSPEC_GRID[k]}={v:g}" for k, v in knobs.items() if not _same(v, getattr(defaults, k))]
            runs.append(MethodRun("semspec@" + ",".join(odd) if odd else "semspec", "semspec",
                                  knobs=knobs, default_setting=not odd))
    for spec in compare_drafts:
        for m in methods:
            if m in ENGINE_DRAFT_METHODS:
                runs.append(MethodRun(f"{m}@draft={draft_name(spec)}", m, draft=spec))
    return runs


def _same(value, default) -> bool:
    return value is default if value is None or default is None else abs(value - default) < 1e-12


def config_for(run: MethodRun, s: BenchSettings, prompt_index: int, max_new_tokens: int | None = None) -> GenerationConfig:
    kw: dict[str, Any] = dict(
        method="ar" if run.method.startswith("hf_") else run.method,
        max_new_tokens=max_new_tokens or s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p if s.temperature > 0 else 1.0,
        seed=s.seed + prompt_index + run.seed_offset,
    )
    kw.update(run.knobs)
    for name in ("step_delimiter", "max_step_tokens", "draft_tokens", "judge_threshold"):
        if getattr(s, name) is not None:
            kw[name] = getattr(s, name)
    return GenerationConfig(**kw)


# --------------------------------------------------------------------------- one run


def _steps_compact(steps) -> list[list]:
    """[index, author, decision, drafted_tokens, accepted_tokens, target_tokens, p_target, p_draft]"""
    r = lambda x: None if x is None else round(float(x), 4)  # noqa: E731
    return [[s.index, s.author, s.decision, s.drafted_tokens, s.accepted_tokens, s.target_tokens,
             r(s.p_target), r(s.p_draft)] for s in steps]


def run_record(run: MethodRun, prompt: dict, *, text: str, wall: float, finish: str, counters: dict,
               steps: list | None, draft_seconds: float, think_end: str | None = None) -> dict:
    return {
        "label": run.label,
        "method": run.method,
        "prompt_id": prompt["id"],
        "text": text,
        "answer": final_answer(text, think_end),
        "finish_reason": finish,
        "wall_seconds": wall,
        "generated_tokens": counters.get("generated_tokens", 0),
        "target_forward_passes": counters.get("target_forward_passes", 0),
        "draft_forward_passes": counters.get("draft_forward_passes", 0),
        "drafted_tokens": counters.get("drafted_tokens", 0),
        "accepted_tokens": counters.get("accepted_tokens", 0),
        "steps_drafted": counters.get("steps_drafted", 0),
        "steps_accepted": counters.get("steps_accepted", 0),
        "phase_seconds": counters.get("phase_seconds", {}),
        "draft_seconds": draft_seconds,
        "steps": steps or [],
    }


def run_engine(engine, run: MethodRun, prompt: dict, cfg: GenerationConfig) -> dict:
    t0 = time.perf_counter()
    res = engine.generate(prompt["prompt"], cfg)
    wall = time.perf_counter() - t0
    counters = asdict(res.counters)
    think_end = engine.think_end_marker if cfg.think_end == "auto" else (cfg.think_end or None)
    return run_record(run, prompt, text=res.text, wall=wall, finish=res.finish_reason, counters=counters,
                      steps=_steps_compact(res.steps), draft_seconds=counters["phase_seconds"].get("draft", 0.0),
                      think_end=think_end)


class _CallMeter:
    """Counts a module's forward calls and the seconds spent in them (forward hooks)."""

    def __init__(self, module):
        self.calls = 0
        self.seconds = 0.0
        self._t: list[float] = []
        self._handles = [
            module.register_forward_pre_hook(lambda *a: self._t.append(time.perf_counter())),
            module.register_forward_hook(lambda *a: self._done()),
        ]

    def _done(self) -> None:
        self.calls += 1
        if self._t:
            self.seconds += time.perf_counter() - self._t.pop()

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class HFGenerate:
    """transformers' own ``generate``: with ``draft``, assisted generation (``hf_assisted``);
    without, plain decoding (``hf_generate``, a reference for the engine's ``ar`` overhead)."""

    def __init__(self, target, draft=None):
        from semspec.components import same_tokenizer

        if draft is not None and not same_tokenizer(target.tokenizer, draft.tokenizer):
            raise ValueError("hf_assisted is run with same-tokenizer drafts only")
        self.target, self.draft = target, draft
        self._assistant_cfg = copy.deepcopy(draft.model.generation_config) if draft is not None else None

    def __call__(self, run: MethodRun, prompt: dict, cfg: GenerationConfig) -> dict:
        tgt, tok = self.target, self.target.tokenizer
        eos = sorted(tgt.eos_token_ids)
        kwargs: dict[str, Any] = dict(
            max_new_tokens=cfg.max_new_tokens, eos_token_id=eos,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos[0],
        )
        if cfg.temperature > 0:
            kwargs.update(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if self.draft is not None:
            self.draft.model.generation_config = copy.deepcopy(self._assistant_cfg)
            kwargs["assistant_model"] = self.draft.model
        t_meter = _CallMeter(tgt.model)
        d_meter = _CallMeter(self.draft.model) if self.draft is not None else None
        try:
            t0 = time.perf_counter()
            ids = torch.tensor([encode_prompt(tok, prompt["prompt"])], device=tgt.device)
            torch.manual_seed(cfg.seed)
            # a reduced-vocabulary assistant runs its reduced LM head (its own ids only)
            with torch.inference_mode(), self.draft.reduced_head() if self.draft is not None else nullcontext():
                out = tgt.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            new = out[0, ids.shape[1]:].tolist()
            finish = "length"
            if new and new[-1] in tgt.eos_token_ids:
                new = new[:-1]
                finish = "eos"
            text = tok.decode(new, skip_special_tokens=True)
            wall = time.perf_counter() - t0
        finally:
            t_meter.close()
            if d_meter is not None:
                d_meter.close()
        counters = {"generated_tokens": len(new), "target_forward_passes": t_meter.calls,
                    "phase_seconds": {"target": t_meter.seconds}}
        if d_meter is not None:
            # each target pass verifies the candidates and adds one token of its own
            produced = len(new) + (1 if finish == "eos" else 0)
            counters.update(draft_forward_passes=d_meter.calls, drafted_tokens=d_meter.calls,
                            accepted_tokens=max(0, produced - t_meter.calls))
            counters["phase_seconds"]["draft"] = d_meter.seconds
        return run_record(run, prompt, text=text, wall=wall, finish=finish, counters=counters, steps=None,
                          draft_seconds=d_meter.seconds if d_meter is not None else 0.0)


# --------------------------------------------------------------------------- the bench


@dataclass
class BenchRun:
    settings: BenchSettings
    prompts: list[dict]
    plan: list[MethodRun]
    runs: dict[str, list[dict | None]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    errors: list[dict] = field(default_factory=list)
    started_at: float = 0.0
    seconds: float = 0.0
    loadavg: dict[str, list[float]] = field(default_factory=dict)  # "start"/"end" 1, 5, 15-minute load
    interrupted: bool = False  # stopped early (Ctrl-C / SIGTERM): only the prompts all methods finished
    git_commit: str | None = None  # the code's commit when the run started


def run_bench(engines: "BenchEngines", settings: BenchSettings, prompts: list[dict] | None = None,
              progress: Callable[[str], None] | None = None, raw_log: str | os.PathLike | None = None) -> BenchRun:
    """Run the plan on ``prompts`` (default: ``settings.prompts`` sliced by limit/offset) with
    ``engines`` (``load_engines``'s for these settings); a run they cannot serve is skipped
    with the reason. ``raw_log``: append each run's record as a JSON line as soon as it is done.
    A ``KeyboardInterrupt`` during the timed runs stops them; the result then holds the
    prompts that every method finished (``interrupted`` is set)."""
    say = progress or (lambda _m: None)
    prompts = prompts if prompts is not None else load_prompts(settings.prompts, settings.limit, settings.offset)
    plan = plan_runs(settings.methods, settings.taus, settings.temperature, attempts=settings.attempts,
                     candidates=settings.candidates,
                     ratio_floors=settings.ratio_floors, adaptive=settings.adaptive,
                     token_speculation=settings.token_speculation, compare_drafts=settings.compare_drafts)
    from .report import git_commit

    br = BenchRun(settings, prompts, plan, started_at=time.time(), git_commit=git_commit())
    if hasattr(os, "getloadavg"):
        br.loadavg["start"] = list(os.getloadavg())

    hf: dict[str, HFGenerate] = {}
    active: list[MethodRun] = []
    for run in plan:
        problem = engines.problem(run)
        if problem is not None:
            br.skipped[run.label] = problem
            continue
        if run.method == "hf_assisted":
            hf["hf_assisted"] = HFGenerate(engines.target, engines.assistant)
        elif run.method == "hf_generate":
            hf["hf_generate"] = HFGenerate(engines.target)
        active.append(run)

    def one(run: MethodRun, prompt: dict, cfg: GenerationConfig) -> dict:
        if run.method in hf:
            return hf[run.method](run, prompt, cfg)
        return run_engine(engines.serving[(run.draft, run.method)], run, prompt, cfg)

    if settings.warmup:
        for run in active:
            try:
                one(run, prompts[0], config_for(run, settings, 0, max_new_tokens=min(8, settings.max_new_tokens)))
            except Exception as e:  # noqa: BLE001 - a failing method is reported, not fatal
                br.skipped[run.label] = f"warm-up failed: {type(e).__name__}: {e}"
        active = [r for r in active if r.label not in br.skipped]

    for run in active:
        br.runs[run.label] = [None] * len(prompts)
    log = open(raw_log, "a") if raw_log else None
    t_start = time.perf_counter()
    completed = 0
    try:
        for i, prompt in enumerate(prompts):
            k = i % len(active) if active else 0
            for run in active[k:] + active[:k]:
                cfg = config_for(run, settings, i)
                try:
                    rec = one(run, prompt, cfg)
                except Exception as e:  # noqa: BLE001
                    br.errors.append({"label": run.label, "prompt_id": prompt["id"],
                                      "error": f"{type(e).__name__}: {e}"})
                    say(f"[{i + 1}/{len(prompts)}] {run.label}: ERROR {type(e).__name__}: {e}")
                    continue
                br.runs[run.label][i] = rec
                if log:
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                say(f"[{i + 1}/{len(prompts)}] {run.label:<18} {rec['wall_seconds']:7.2f}s "
                    f"{rec['generated_tokens']:4d} tok  answer={rec['answer']}")
            completed = i + 1
    except KeyboardInterrupt:
        br.interrupted = True
        say(f"interrupted: keeping the {completed} prompt(s) every method finished")
        br.prompts = prompts = prompts[:completed]
        br.runs = {label: recs[:completed] for label, recs in br.runs.items()}
    finally:
        if log:
            log.close()
    br.seconds = time.perf_counter() - t_start
    if hasattr(os, "getloadavg"):
        br.loadavg["end"] = list(os.getloadavg())

    if settings.loglik:
        say("target log-likelihood of every output (untimed)")
        for label, recs in br.runs.items():
            for prompt, rec in zip(prompts, recs):
                if rec is not None:
                    rec["target_mean_loglik"] = target_mean_loglik(engines.target, prompt["prompt"], rec["text"])
    return br



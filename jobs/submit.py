"""Submitting a job: validate the whole file, then store the job and its items in one
transaction (bulk inserts in batches, the file streamed twice, never held in memory), then
hand the items to an `enqueue` callable in chunks. Shared by `semjobs submit` (enqueue to
Celery) and `semjobs run` (no queue: the items are processed in this process)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid
from pathlib import Path
from typing import Callable, Iterable, Iterator

from semjobs import __version__
from semjobs.settings import settings
from semspec.models.hub import HubName, fetch_snapshot, parse_hub_name
from semspec.models.paths import ModelLoadError
from semspec.types import METHODS, NGRAM_DRAFT, GenerationConfig

from semjobs.db import repo, surplus
from semjobs.db.session import session_factory
from semjobs.jobs.schema import (InputError, Record, Validation, column_chars, iter_records, name_problem,
                                 validate_file)


class InvalidInput(Exception):
    def __init__(self, validation: Validation):
        self.validation = validation
        super().__init__(f"{validation.n_errors} problem(s) in {validation.path}")

    def lines(self) -> list[str]:
        v = self.validation
        out = [f"{v.path}: {e}" for e in v.errors]
        if v.n_errors > len(v.errors):
            out.append(f"... and {v.n_errors - len(v.errors)} more")
        return out


def job_config(
    method: str | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    top_p: float | None = None,
    tau: float | None = None,
    stop_loops: bool | None = None,
    stop_doomed: bool | None = None,
) -> dict:
    """The job's GenerationConfig as a dict: command-line values over settings defaults."""
    method = method or settings.method
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    cfg = GenerationConfig(
        method=method,
        max_new_tokens=max_new_tokens if max_new_tokens is not None else settings.max_new_tokens,
        temperature=temperature if temperature is not None else settings.temperature,
        seed=seed if seed is not None else settings.seed,
        draft_max_batch=settings.draft_max_batch,
        stop_loops=stop_loops if stop_loops is not None else settings.stop_loops,
        stop_doomed=stop_doomed if stop_doomed is not None else settings.stop_doomed,
    )
    if top_p is not None:
        cfg.top_p = top_p
    if tau is not None:
        cfg.tau = tau
    stored = dataclasses.asdict(cfg)
    if cfg.tau is None:  # unset: the worker's engine decides (GenerationConfig.tau), whatever its release
        del stored["tau"]
    return stored


def sample_seed(seed: int, input_id: str | int, sample: int) -> int:
    """The seed of one sample of an input: sample 0 keeps the seed as given (so a job of one
    sample per input, and an explicit per-line seed, mean what they always meant); later
    samples get one derived from the seed, the input's id and the sample index, so a rerun
    reproduces every sample and no two samples share a seed."""
    if sample == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:{input_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def item_config(job_cfg: dict, request: dict, sample: int = 0) -> GenerationConfig:
    """Per-item config: the job's, with the item's own parameters (batch lines) on top, and
    the seed of this sample."""
    cfg = GenerationConfig(**{**job_cfg, **request.get("params", {})})
    cfg.seed = sample_seed(cfg.seed, request["id"], sample)
    if request.get("chat_template_kwargs"):
        cfg.chat_template_kwargs = request["chat_template_kwargs"]
    return cfg


def chunks(seqs: Iterable[int], size: int) -> Iterator[list[int]]:
    batch: list[int] = []
    for s in seqs:
        batch.append(s)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


MODEL_SETTINGS = {"target_model": "SEMJOBS_TARGET_MODEL", "draft_model": "SEMJOBS_DRAFT_MODEL",
                  "probes_dir": "SEMJOBS_PROBES_DIR"}


def missing_model_files() -> list[str]:
    """The model settings that name a local path this machine does not have, or a hub model
    (or revision) neither in the Hugging Face cache nor to be downloaded, each as one
    sentence: a typo would otherwise be stored and fail on every worker. Checked with the
    prompt lengths (`settings.check_prompt_lengths`; off on a machine that submits for
    workers whose files it lacks)."""
    if not settings.check_prompt_lengths:
        return []
    from semspec.components import draft_model_spec  # imports torch: not in the worker's parent process

    missing = []
    for key, env in MODEL_SETTINGS.items():
        value = spec = getattr(settings, key)
        if key == "draft_model":  # a token_sd draft named by its kind: the model it names, if any
            spec = draft_model_spec(value)
        if (spec and spec not in ("none", NGRAM_DRAFT) and not spec.startswith("embedded:")
                and not Path(spec).expanduser().exists()):
            hub = parse_hub_name(spec)
            problem = "no such file or directory here" if hub is None else unavailable_hub_model(hub)
            if problem is not None:
                missing.append(f"{env}={value}: {problem}")
    return missing


def unavailable_hub_model(name: HubName) -> str | None:
    """Why the hub model ``name`` cannot be had here (a revision the hub lacks, one not cached
    while offline), or None: its config and tokenizer files are fetched, never its weights."""
    try:
        fetch_snapshot(name, with_weights=False)
    except ModelLoadError as e:
        return str(e)
    return None


def method_problem(method: str) -> str | None:
    """Why the settings' models cannot run ``method`` (a draft missing, probes calibrated for
    other models), told from their files on this machine (``semspec.preflight``); checked with
    the prompt lengths, like `missing_model_files`."""
    if not settings.check_prompt_lengths:
        return None
    from semspec.preflight import method_problem as problem

    return problem(method, settings.target_model, settings.draft_model, settings.probes_dir, settings.cache_dir)


def target_names() -> frozenset[str]:
    """The names a Batch body's `model` may give the settings' target by (``spec_names``, and
    ``settings.served_model_name``)."""
    from semspec.models.specs import spec_names

    names = spec_names(settings.target_model)
    return names | {settings.served_model_name} if settings.served_model_name else names


def validate(path: str | Path, samples: int = 1, want: int | None = None,
             temperature: float | None = None) -> Validation:
    """`validate_file` with the settings' limits and the target's context (semjobs.jobs.context)."""
    from semjobs.jobs.context import ContextCheck

    check = ContextCheck(settings.target_model, settings.cache_dir) if settings.check_prompt_lengths else None
    validation = validate_file(path, settings.max_line_bytes, samples, fits=check,
                               max_items=settings.max_job_items, max_bytes=settings.max_job_bytes, want=want,
                               models=target_names(),
                               temperature=settings.temperature if temperature is None else temperature)
    validation.context_unchecked = check.unavailable if check is not None else None
    return validation


def manifest_for(path: Path, validation: Validation, queue: str, samples: int, want: int | None = None,
                 budget_tokens: int | None = None) -> dict:
    return {
        "input": {
            "path": str(path.resolve()),
            "sha256": validation.sha256,
            "bytes": os.path.getsize(path),
            "items": validation.n_items,
        },
        "samples_per_input": samples,
        # kept samples wanted per input (a line's own `want` wins); None: every sample is decoded
        "want_per_input": want,
        # lines with a `want` of their own (semjobs.db.surplus.line_wants)
        "line_wants": validation.n_wanting,
        # the job's samples go out in waves (semjobs.db.surplus.work_order): some input wants
        "in_waves": want is not None or validation.n_wanting > 0,
        # tokens the job may generate; once spent, samples not started end over_budget
        "budget_tokens": budget_tokens,
        "models": {
            "target": settings.target_model or "embedded",
            "draft": settings.draft_model or "embedded",
            "probes": settings.probes_dir or "embedded",
            "device": settings.device,
        },
        "engine": settings.engine_factory or "vllm",
        "queue": queue,
        "semjobs_version": __version__,
    }


def _rows(path: Path, samples: int) -> Iterator[dict]:
    """One row per sample of every input, an input's samples adjacent (a job that wants or
    budgets decodes them in waves: semjobs.db.surplus.work_order)."""
    seq = 0
    for rec in iter_records(path, settings.max_line_bytes):
        if isinstance(rec, InputError):  # the file changed since validation
            raise RuntimeError(f"{path} changed while being submitted: {rec}")
        assert isinstance(rec, Record)
        request = rec.request()
        for sample in range(rec.samples(samples)):
            yield {"seq": seq, "line": rec.line, "item_id": rec.key, "sample": sample, "request": request}
            seq += 1


def store_job(
    path: str | Path,
    config: dict,
    *,
    queue: str,
    name: str | None = None,
    url: str | None = None,
    status: str = "pending",
    validation: Validation | None = None,
    samples: int = 1,
    want: int | None = None,
    budget_tokens: int | None = None,
) -> tuple[str, int]:
    """Validate `path` completely (unless `validation` of it is given), then store job +
    items: `samples` per input (a line's own `n` wins), of which `want` kept ones are enough
    (a line's own `want` wins; None: all), within ``budget_tokens`` generated. Raises InvalidInput (and writes nothing) when any
    line is bad, ValueError when ``name`` cannot be stored, JobRuleError when the settings break a rule
    (``check_job_rules``).
    Returns (job id, number of items)."""
    path = Path(path)
    problem = name_problem(name) if name is not None else None
    if problem:
        raise ValueError(f"job name {problem}")
    check_job_rules(config, samples, want)
    if validation is None:
        validation = validate(path, samples, want, config["temperature"])
    if not validation.ok:
        raise InvalidInput(validation)
    job_id = uuid.uuid4().hex[:12]
    with session_factory(url)() as session:
        n = repo.create_job(
            session,
            job_id=job_id,
            name=name or path.name[:column_chars("Job", "name")],  # the full path is in the manifest
            method=config["method"],
            input_format=validation.format,
            queue=queue,
            config=config,
            manifest=manifest_for(path, validation, queue, samples, want, budget_tokens),
            items=_rows(path, samples),
            batch_size=settings.insert_batch_size,
            status=status,
        )
        if n != validation.n_samples:
            session.rollback()
            raise RuntimeError(f"{path} changed while being submitted")
        session.commit()
    return job_id, n


class JobRuleError(ValueError):
    """A job's settings that break a rule; ``option``: the one at fault (``--option`` on the CLI)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


def check_job_rules(config: dict, samples: int = 1, want: int | None = None, seed_given: bool = False) -> None:
    """The rules a job's settings obey, for every way a job is made (the CLI, the Python API;
    a line's own fields: ``validate``); JobRuleError names the first broken. ``seed_given``: a
    seed was asked for (rather than the settings' default)."""
    if seed_given and not config.get("reproducible", True):
        raise JobRuleError("seed", "a seed means nothing to a job sampled without seeds")
    if config.get("tau") is not None and config["method"] != "semspec":
        raise JobRuleError("tau", f"tau is semspec's floor on its target probe; method {config['method']!r} "
                                  "has no probes")
    if samples > 1 and config["temperature"] == 0:
        raise JobRuleError("n", f"{samples} samples of greedy decoding would be {samples} copies; give --temperature "
                                "above 0 (e.g. 0.6)")
    if want is not None and not 1 <= want <= samples:
        raise JobRuleError("want", f"want {want} kept samples of each input out of {samples} (--n): give --want "
                                   "between 1 and --n")


def find_resumable(validation: Validation, config: dict, *, samples: int = 1, want: int | None = None,
                   budget_tokens: int | None = None, url: str | None = None) -> str | None:
    """The newest unfinished job of the same input file (sha256), config, samples and kept
    samples wanted per input, if any."""
    from sqlalchemy import select

    from semjobs.db.models import JOB_ACTIVE, Job

    with session_factory(url)() as session:
        for job in session.scalars(
            select(Job).where(Job.status.in_(JOB_ACTIVE)).order_by(Job.created_at.desc())
        ):
            if job.manifest.get("input", {}).get("sha256") == validation.sha256 \
                    and job.config == config and job.manifest.get("samples_per_input", 1) == samples \
                    and job.manifest.get("want_per_input") == want \
                    and job.manifest.get("budget_tokens") == budget_tokens:
                return job.id
    return None


def unfinished_seqs(job_id: str, *, url: str | None = None) -> list[int]:
    from sqlalchemy import select

    from semjobs.db.models import Item

    with session_factory(url)() as session:
        return list(session.scalars(
            select(Item.seq).where(Item.job_id == job_id, Item.status.in_(("pending", "running")))
            .order_by(Item.seq)
        ))


def work_order(job_id: str, seqs: list[int], url: str | None = None) -> tuple[list[int], bool]:
    """``seqs`` in the order they should decode (semjobs.db.surplus.work_order), and whether
    that order is in waves (then processes that share them should take them in turn)."""
    with session_factory(url)() as session:
        ordered = surplus.work_order(session, job_id, seqs)
    return ordered, ordered != sorted(seqs)


def send_chunks(session, job_id: str, seqs: list[int], enqueue: Callable[[str, list[int], list[str]], None]) -> int:
    """Hand `seqs` to `enqueue` in chunks, each with its items' input ids (for Flower);
    returns how many chunks."""
    labels = repo.item_labels(session, job_id, None if len(seqs) > 1000 else seqs)
    seqs = surplus.work_order(session, job_id, seqs)
    n = 0
    for chunk in chunks(seqs, settings.chunk_size):
        enqueue(job_id, chunk, [labels[s] for s in chunk])
        n += 1
    return n


def enqueue_job(
    job_id: str,
    enqueue: Callable[[str, list[int], list[str]], None],
    *,
    url: str | None = None,
    seqs: list[int] | None = None,
) -> int:
    """Send the job's pending items (or `seqs`) to `enqueue` in chunks, with their input ids
    (for Flower); job -> queued."""
    with session_factory(url)() as session:
        if seqs is None:
            seqs = repo.pending_seqs(session, job_id)
        n = send_chunks(session, job_id, seqs, enqueue)
        repo.set_job_status(session, job_id, "queued", only_from=("pending",))
        session.commit()
    return n

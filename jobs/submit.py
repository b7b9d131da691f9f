"""Submitting a job: validate the whole file, then store the job and its items in one
transaction (bulk inserts in batches, the file streamed twice, never held in memory), then
hand the items to an `enqueue` callable in chunks. Shared by `semjobs submit` (enqueue to
Celery) and `semjobs run` (no queue: the items are processed in this process)."""

from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path
from typing import Callable, Iterable, Iterator

from semjobs import __version__
from semjobs.settings import settings
from semspec.types import METHODS, GenerationConfig

from db import repo
from db.session import session_factory
from jobs.schema import InputError, Record, Validation, iter_records, validate_file


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
    )
    if top_p is not None:
        cfg.top_p = top_p
    return dataclasses.asdict(cfg)


def item_config(job_cfg: dict, request: dict) -> GenerationConfig:
    """Per-item config: the job's, with the item's own parameters (batch lines) on top."""
    return GenerationConfig(**{**job_cfg, **request.get("params", {})})


def chunks(seqs: Iterable[int], size: int) -> Iterator[list[int]]:
    batch: list[int] = []
    for s in seqs:
        batch.append(s)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def manifest_for(path: Path, validation: Validation, queue: str) -> dict:
    return {
        "input": {
            "path": str(path.resolve()),
            "sha256": validation.sha256,
            "bytes": os.path.getsize(path),
            "items": validation.n_items,
        },
        "models": {
            "target": settings.target_model or "embedded",
            "draft": settings.draft_model or "embedded",
            "probes": settings.probes_dir or "embedded",
            "device": settings.device,
        },
        "engine_factory": settings.engine_factory,
        "queue": queue,
        "semjobs_version": __version__,
    }


def _rows(path: Path) -> Iterator[dict]:
    seq = 0
    for rec in iter_records(path, settings.max_line_bytes):
        if isinstance(rec, InputError):  # the file changed since validation
            raise RuntimeError(f"{path} changed while being submitted: {rec}")
        assert isinstance(rec, Record)
        yield {"seq": seq, "line": rec.line, "item_id": rec.key, "request": rec.request()}
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
) -> tuple[str, int]:
    """Validate `path` completely (unless `validation` of it is given), then store job +
    items. Raises InvalidInput (and writes nothing) when any line is bad. Returns (job id,
    number of items)."""
    path = Path(path)
    if validation is None:
        validation = validate_file(path, settings.max_line_bytes)
    if not validation.ok:
        raise InvalidInput(validation)
    job_id = uuid.uuid4().hex[:12]
    with session_factory(url)() as session:
        n = repo.create_job(
            session,
            job_id=job_id,
            name=name or path.name,
            method=config["method"],
            input_format=validation.format,
            queue=queue,
            config=config,
            manifest=manifest_for(path, validation, queue),
            items=_rows(path),
            batch_size=settings.insert_batch_size,
            status=status,
        )
        if n != validation.n_items:
            session.rollback()
            raise RuntimeError(f"{path} changed while being submitted")
        session.commit()
    return job_id, n


def find_resumable(validation: Validation, config: dict, *, url: str | None = None) -> str | None:
    """The newest unfinished job of the same input file (sha256) and config, if any."""
    from sqlalchemy import select

    from db.models import JOB_ACTIVE, Job

    with session_factory(url)() as session:
        for job in session.scalars(
            select(Job).where(Job.status.in_(JOB_ACTIVE)).order_by(Job.created_at.desc())
        ):
            if job.manifest.get("input", {}).get("sha256") == validation.sha256 \
                    and job.config == config:
                return job.id
    return None


def unfinished_seqs(job_id: str, *, url: str | None = None) -> list[int]:
    from sqlalchemy import select

    from db.models import Item

    with session_factory(url)() as session:
        return list(session.scalars(
            select(Item.seq).where(Item.job_id == job_id, Item.status.in_(("pending", "running")))
            .order_by(Item.seq)
        ))


def enqueue_job(
    job_id: str,
    enqueue: Callable[[str, list[int]], None],
    *,
    url: str | None = None,
    seqs: list[int] | None = None,
) -> int:
    """Send the job's pending items (or `seqs`) to `enqueue` in chunks; job -> queued."""
    with session_factory(url)() as session:
        if seqs is None:
            seqs = repo.pending_seqs(session, job_id)
        n = 0
        for chunk in chunks(seqs, settings.chunk_size):
            enqueue(job_id, chunk)
            n += 1
        repo.set_job_status(session, job_id, "queued", only_from=("pending",))
        session.commit()
    return n

"""Probe calibration as a bulk job (`semjobs probe collect --submit`).

Collecting samples for a large target is hours of accelerator time, so the questions go on
the pair's queue like a job's items: each message asks for one question (its trace and every
prefix of it), and any worker with the pair loaded runs it through the same code as
`semjobs probe collect` in process (`semspec.calibration.collect.collect`, into a scratch
directory), then stores the prefix files it wrote, byte for byte, with the question marked
done, in one transaction. `semjobs probe merge OUT --calibration ID` writes them out as a
calibration directory, which `probe label` and `probe train` read as usual.

Delivery is at least once, as for items: a question already done is skipped, and its
prefixes are keyed by (calibration, prefix), so a redelivery stores nothing twice. Sampling
is seeded per question and prefix, so whichever worker runs a question stores the same
samples (given the same models and number type).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from semjobs.db import repo
from semjobs.db.models import Calibration, CalibrationPrefix, CalibrationQuestion, utcnow
from semjobs.db.session import session_factory
from semjobs.settings import settings
from semspec.calibration.store import MERGE_KEYS, with_old_defaults
from semspec.models.identity import identity_sha256

# collect.json keys that every question's run must agree on: what merging needs, and the
# seed, since one calibration is one sampling process
SAME_META = (*MERGE_KEYS, "seed")


class CalibrationError(RuntimeError):
    """A question cannot run here (another model pair than the calibration's)."""


def create(prompts: list[tuple[str, str]], config, queue: str, url: str | None = None) -> str:
    """Store a calibration and its questions (pending); returns its id."""
    cal_id = uuid.uuid4().hex[:12]
    with session_factory(url)() as s:
        s.add(Calibration(id=cal_id, queue=queue, config=dataclasses.asdict(config), created_at=utcnow()))
        s.flush()
        s.add_all(CalibrationQuestion(calibration_id=cal_id, question_id=qid, seq=i, prompt=prompt,
                                      status="pending", attempts=0)
                  for i, (qid, prompt) in enumerate(prompts))
        s.commit()
    return cal_id


def pending_questions(calibration_id: str, url: str | None = None) -> list[str]:
    with session_factory(url)() as s:
        return list(s.scalars(select(CalibrationQuestion.question_id).where(
            CalibrationQuestion.calibration_id == calibration_id, CalibrationQuestion.status == "pending")
            .order_by(CalibrationQuestion.seq)))


def counts(calibration_id: str, url: str | None = None) -> dict[str, int]:
    with session_factory(url)() as s:
        if s.get(Calibration, calibration_id) is None:
            raise CalibrationError(f"no calibration {calibration_id!r}")
        by_status = dict(s.execute(
            select(CalibrationQuestion.status, func.count()).where(
                CalibrationQuestion.calibration_id == calibration_id).group_by(CalibrationQuestion.status)).all())
        prefixes = s.scalar(select(func.count()).select_from(CalibrationPrefix).where(
            CalibrationPrefix.calibration_id == calibration_id))
    return {"pending": 0, "running": 0, "done": 0, "failed": 0, **by_status, "prefixes": prefixes}


def run_question(calibration_id: str, question_id: str, models, worker: str,
                 url: str | None = None, collect: Callable | None = None) -> str:
    """Collect one question with the loaded pair (``semspec.calibration.collect.CalibrationModels``)
    and store what it wrote. Returns "done",
    "skipped" (done before, or unknown), "busy" (a worker that still beats runs it: ask
    again later) or "failed" (the attempt cap, another pair, or the collection raised)."""
    from semspec.calibration.collect import CollectConfig, collect as collect_in_process
    from semspec.calibration.store import COLLECT_META, CalibrationStore

    collect = collect or collect_in_process
    Q = CalibrationQuestion
    this = (Q.calibration_id == calibration_id, Q.question_id == question_id)
    with session_factory(url)() as s:
        cal = s.get(Calibration, calibration_id)
        if cal is None:
            return "skipped"
        # a lease, as items have: pending, or running on a worker that stopped beating
        claimed = s.execute(
            update(Q).where(*this, or_(Q.status == "pending", and_(
                Q.status == "running",
                or_(Q.worker == worker, ~repo.beats(s, Q.worker, settings.worker_dead_after_s)))))
            .values(status="running", attempts=Q.attempts + 1, worker=worker)
            .returning(Q.prompt, Q.attempts)
        ).first()
        s.commit()
        if claimed is None:
            status = s.scalar(select(Q.status).where(*this))
            return "busy" if status == "running" else "skipped"
        prompt, attempts = claimed
        mine = (*this, Q.status == "running", Q.worker == worker)
        if attempts > settings.max_attempts:
            return _fail(s, mine, f"gave up after {attempts - 1} deliveries that never finished "
                         f"(max_attempts={settings.max_attempts}; was the worker killed?)")
        problem = _wrong_pair(cal, models)
        if problem is not None:
            return _fail(s, mine, problem)
        cfg = CollectConfig(**{**cal.config, "max_prefixes": None})
        with tempfile.TemporaryDirectory(prefix="semjobs-cal-") as scratch:
            try:
                collect(models, [(question_id, prompt)], scratch, cfg)
            except Exception as e:  # noqa: BLE001  (a bad question fails alone, with its reason)
                return _fail(s, mine, f"{type(e).__name__}: {e}")
            store = CalibrationStore(scratch)
            meta = json.loads((store.root / COLLECT_META).read_text())
            problem = _check_pair(s, cal, meta)
            if problem is not None:
                return _fail(s, mine, problem)
            trace = store.load_traces().get(question_id, [])
            for key in store.keys():
                record, features = store.prefix_files(key)
                s.merge(CalibrationPrefix(calibration_id=calibration_id, key=key, question_id=question_id,
                                          record=record, features=features))
        done = s.execute(update(Q).where(*mine).values(status="done", trace=trace, finished_at=utcnow(), error=None))
        if done.rowcount == 0:  # another delivery took it over meanwhile: its result stands
            s.rollback()
            return "skipped"
        s.commit()
    return "done"


def calibration_layers(calibration_id: str, url: str | None = None) -> tuple | None:
    """((role, hidden_states index), ...) the calibration's probes read, which a worker's
    engines must store; None for an unknown calibration."""
    from semspec.calibration.collect import CollectConfig, layer_for

    with session_factory(url)() as s:
        cal = s.get(Calibration, calibration_id)
        if cal is None:
            return None
        cfg = CollectConfig(**cal.config)
    return tuple((role, layer_for(cfg, role)) for role in ("target", "draft"))


def fail_question(calibration_id: str, question_id: str, error: str, url: str | None = None) -> str:
    """Fail a question no worker has started, with ``error`` (this worker cannot run it)."""
    Q = CalibrationQuestion
    with session_factory(url)() as s:
        return _fail(s, (Q.calibration_id == calibration_id, Q.question_id == question_id, Q.status == "pending"),
                     error)


def _wrong_pair(cal: Calibration, models) -> str | None:
    """Refuse before the work when the loaded pair is not the calibration's."""
    if "draft" not in models.roles:
        return "this worker loaded no draft; a calibration samples from both models of the pair"
    engine = with_old_defaults(cal.meta)["engine"] if cal.meta else None
    if engine is not None and models.engine != engine:
        return (f"this worker samples with {models.engine}, the calibration's questions so far with {engine}; "
                "run them on workers with the same engine, dtype and vLLM version")
    recorded = (cal.meta or {}).get("models") or {}
    for role in ("target", "draft"):
        want = (recorded.get(role) or {}).get("identity")
        have = str(models.describe(role).get("identity") or "")
        if want is not None and have and identity_sha256(want) != identity_sha256(have):
            return (f"this worker's {role} is {have}, the calibration's {want}; run its questions on "
                    "workers that load the same models")
    return None


def _check_pair(s: Session, cal: Calibration, meta: dict) -> str | None:
    """The first question run records what the worker loaded; later ones must match it."""
    if cal.meta is None:
        s.execute(update(Calibration).where(Calibration.id == cal.id, Calibration.meta.is_(None))
                  .values(meta=meta))
        s.flush()
        s.refresh(cal)
    old, new = with_old_defaults(cal.meta), with_old_defaults(meta)
    diff = {k: (old.get(k), new.get(k)) for k in SAME_META if old.get(k) != new.get(k)}
    if diff:
        return (f"this worker's pair or settings differ from the calibration's: {diff}; run the "
                "calibration's questions on workers that load the same models")
    return None


def _fail(s: Session, held, error: str) -> str:
    """Mark the question this delivery holds failed (nothing if another took it over)."""
    s.rollback()
    s.execute(update(CalibrationQuestion).where(*held).values(status="failed", error=error[:10_000],
                                                               finished_at=utcnow()))
    s.commit()
    return "failed"


def export(calibration_id: str, out_dir: str | Path, url: str | None = None) -> dict:
    """Write what the workers stored as a calibration directory (`semspec.calibration.store`)."""
    from semspec.calibration.store import CalibrationStore

    store = CalibrationStore(out_dir)
    with session_factory(url)() as s:
        cal = s.get(Calibration, calibration_id)
        if cal is None:
            raise CalibrationError(f"no calibration {calibration_id!r}")
        if cal.meta is None:
            raise CalibrationError(f"calibration {calibration_id} has no question done yet")
        questions = list(s.scalars(select(CalibrationQuestion).where(
            CalibrationQuestion.calibration_id == calibration_id).order_by(CalibrationQuestion.seq)))
        store.init({**cal.meta, "prompts": len(questions), "calibration": calibration_id})
        have = store.load_traces()
        for q in questions:
            if q.status == "done" and q.question_id not in have:
                store.append_trace(q.question_id, list(q.trace or []))
        n = 0
        for row in s.scalars(select(CalibrationPrefix).where(CalibrationPrefix.calibration_id == calibration_id)):
            store.put_prefix_files(row.key, row.record, row.features)
            n += 1
    return {"questions_done": sum(q.status == "done" for q in questions),
            "questions": len(questions), "prefixes": n}

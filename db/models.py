"""SQLAlchemy 2.x models. The schema itself is created only by the Alembic migrations in
`migrations/`; these classes describe it for queries (a test checks that both agree).

Tables: jobs, items (unique per job by input id and sample, and by position), outputs (one per item:
the unique key makes the commit of a result idempotent), step_log (one row per reasoning
step, the fields of `semspec.types.StepRecord`), item_stats (per-item throughput, the
fields of `semspec.types.Counters` plus wall time), workers (one heartbeat row per
process that runs tasks, so the items of a dead one can be re-enqueued: `semjobs.worker.recovery`),
and the probe calibrations that workers collect (`semjobs probe collect --submit`:
calibrations, calibration_questions, calibration_prefixes; `semjobs.jobs.calibration`).
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    LargeBinary,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from semspec.types import COUNT_FIELDS

# Job lifecycle: pending (rows stored, not yet enqueued) -> queued -> running ->
# completed (every item reached a final state; counts say how many failed) | cancelled.
JOB_STATUSES = ("pending", "queued", "running", "completed", "cancelled")
JOB_ACTIVE = ("pending", "queued", "running")
# Item lifecycle: pending -> running -> done | failed ; pending/running -> cancelled;
# running -> unneeded (a sample of an input that already has the kept samples its job wants:
# not decoded, or aborted mid-decode) | over_budget (claimed once the job had spent its token
# budget: not decoded); semjobs.db.surplus.
ITEM_STATUSES = ("pending", "running", "done", "failed", "cancelled", "unneeded", "over_budget")
ITEM_FINAL = ("done", "failed", "cancelled", "unneeded", "over_budget")

# BIGINT on Postgres, INTEGER (the rowid alias, so it autoincrements) on SQLite.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    method: Mapped[str] = mapped_column(String(32))
    input_format: Mapped[str] = mapped_column(String(16))  # "plain" | "openai_batch"
    queue: Mapped[str] = mapped_column(String(200))
    n_items: Mapped[int] = mapped_column(Integer)
    # GenerationConfig fields used for every item (items may override some).
    config: Mapped[dict] = mapped_column(JSON)
    # Reproducibility manifest: input file name + sha256, model settings, engine identities
    # (filled by the first worker that loads the engine), service version.
    manifest: Mapped[dict] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Item(Base):
    __tablename__ = "items"
    __table_args__ = (
        UniqueConstraint("job_id", "item_id", "sample", name="uq_items_job_item_sample"),
        UniqueConstraint("job_id", "seq", name="uq_items_job_seq"),
        Index("ix_items_job_status", "job_id", "status"),
        Index("ix_items_worker", "worker"),  # added in 0003: the reaper's look-up
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)  # 0-based position in the input file
    line: Mapped[int] = mapped_column(Integer)  # 1-based line number in the input file
    item_id: Mapped[str] = mapped_column(String(512))  # the input's id, as text
    # which of the input's samples (0-based; added in 0004): each sample is an item of its own
    sample: Mapped[int] = mapped_column(Integer, server_default="0")
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    # Normalised request: {"id": original id, "prompt" | "messages", "params": {...}, "meta": {...}}
    request: Mapped[dict] = mapped_column(JSON)
    # The worker process (`Worker.name`) holding the item: running it, or (pending) holding
    # it in the chunk it is working through. NULL once released back to the queue.
    worker: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Output(Base):
    __tablename__ = "outputs"

    item_pk: Mapped[int] = mapped_column(
        BigId, ForeignKey("items.id", ondelete="CASCADE"), primary_key=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    text: Mapped[str] = mapped_column(Text)
    final_answer: Mapped[str | None] = mapped_column(Text)
    # Added in 0004; NULL on rows written before it. The trace before its answer, the answer
    # part, and whether final_answer matches the input's reference (NULL: no reference).
    reasoning: Mapped[str | None] = mapped_column(Text)
    content: Mapped[str | None] = mapped_column(Text)
    correct: Mapped[bool | None] = mapped_column(Boolean)
    # Added in 0007; NULL on rows written before it: a sample its dataset keeps
    # (semspec.answers.is_kept), what a job's want of K kept samples per input counts.
    kept: Mapped[bool | None] = mapped_column(Boolean)
    finish_reason: Mapped[str] = mapped_column(String(16))
    models: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StepLog(Base):
    __tablename__ = "step_log"
    __table_args__ = (UniqueConstraint("item_pk", "step_index", name="uq_step_log_item_step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    item_pk: Mapped[int] = mapped_column(BigId, ForeignKey("items.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step_index: Mapped[int] = mapped_column(Integer)
    author: Mapped[str] = mapped_column(String(16))  # "draft" | "target"
    text: Mapped[str] = mapped_column(Text)
    drafted_tokens: Mapped[int] = mapped_column(Integer)
    accepted_tokens: Mapped[int] = mapped_column(Integer)
    decision: Mapped[str] = mapped_column(String(16))  # accepted | rejected | target_only
    p_target: Mapped[float | None] = mapped_column(Float)
    p_draft: Mapped[float | None] = mapped_column(Float)
    accept_prob: Mapped[float | None] = mapped_column(Float)
    seconds: Mapped[float] = mapped_column(Float)
    # Added in 0002; NULL on rows written before it.
    target_tokens: Mapped[int | None] = mapped_column(Integer)  # target-tokenizer tokens in text
    draft_text: Mapped[str | None] = mapped_column(Text)  # the drafted step, when rejected
    judge_score: Mapped[int | None] = mapped_column(Integer)  # step_judge: target's 0-9 score
    # Added in 0005: why the target wrote a step no draft was tried for (StepRecord.reason).
    reason: Mapped[str | None] = mapped_column(String(16))


# One integer column per engine counter (semspec.types.COUNT_FIELDS), declared from that
# list so the table cannot drift from the dataclass; the migrations spell each one out.
_CounterColumns = type("_CounterColumns", (), {name: mapped_column(Integer, nullable=False) for name in COUNT_FIELDS})


class ItemStats(_CounterColumns, Base):
    __tablename__ = "item_stats"

    item_pk: Mapped[int] = mapped_column(
        BigId, ForeignKey("items.id", ondelete="CASCADE"), primary_key=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    wall_seconds: Mapped[float] = mapped_column(Float)
    n_steps: Mapped[int] = mapped_column(Integer)
    phase_seconds: Mapped[dict] = mapped_column(JSON)


class Worker(Base):
    """Liveness of one process that runs tasks ("node@host:pid", as stored in items.worker).
    Times come from the database's clock, so workers' clocks need not agree."""

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Calibration(Base):
    """A probe calibration collected by workers: the collect settings (`config`), the
    pair's queue and, once a worker has run a question, what it loaded (`meta`)."""

    __tablename__ = "calibrations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    queue: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict] = mapped_column(JSON)  # semspec.calibration.collect.CollectConfig
    # the collect.json of the first question a worker ran (models, layers); the others must agree
    meta: Mapped[dict | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class CalibrationQuestion(Base):
    """One question of a calibration: the unit a worker takes (its trace and all its
    prefixes). pending -> running (held by `worker`) -> done | failed."""

    __tablename__ = "calibration_questions"

    calibration_id: Mapped[str] = mapped_column(ForeignKey("calibrations.id", ondelete="CASCADE"),
                                                primary_key=True)
    question_id: Mapped[str] = mapped_column(String(512), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)  # position in the prompts file
    prompt: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    trace: Mapped[list | None] = mapped_column(JSON)  # the target's trace steps, once done
    attempts: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(200))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class CalibrationPrefix(Base):
    """One prefix of a calibration, as `semspec.calibration.store` writes it to a file pair:
    its JSON record and its features (the safetensors bytes)."""

    __tablename__ = "calibration_prefixes"

    calibration_id: Mapped[str] = mapped_column(ForeignKey("calibrations.id", ondelete="CASCADE"),
                                                primary_key=True)
    key: Mapped[str] = mapped_column(String(600), primary_key=True)
    question_id: Mapped[str] = mapped_column(String(512))
    record: Mapped[bytes] = mapped_column(LargeBinary)  # the prefix's .json, byte for byte
    features: Mapped[bytes] = mapped_column(LargeBinary)  # its .safetensors

"""Small repository functions: every read and write the service does, in plain SQL terms.

Delivery is at least once (README: "Workers that die"), so the item writes are idempotent:
- `claim_item` moves pending/running -> running and counts the attempt (a redelivered item
  left `running` by a dead worker is claimable again; the attempt cap lives here);
- `save_result` inserts the output keyed by the item (primary key), so a second delivery of a
  finished item cannot store a second output: it gets an IntegrityError and is dropped;
- items already done are never claimed again.

Every write that settles an item is guarded by the state it expects (issue 46): a result is
stored only while the item runs, so a late result cannot turn an item that was cancelled or
failed meanwhile into `done`; a failure or an abort only settles an item its worker still
holds, and a worker that cannot serve a chunk (`fail_pending`) fails only its items no worker
holds. A guarded write that finds nothing to change says so (False) and raises nothing.
`reset_failed` (retry) refuses a cancelled job, so a retry never undoes a cancel.

A whole worker lost (SIGKILL, preempted node) leaves its chunk unacknowledged until the
broker's visibility timeout (hours). So each task marks the items of its chunk as held by
its worker (`hold_items`), workers beat (`beat`), and `release_dead_workers` hands the items
of a worker that stopped beating back to the queue, once, whoever else runs it concurrently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Iterator

from sqlalchemy import case, delete, exists, func, insert, or_, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from semjobs.db.models import (ITEM_STATUSES, JOB_ACTIVE, CalibrationQuestion, Item, ItemStats, Job, Output, StepLog,
                               Worker, utcnow)
from semspec.answers import is_kept
from semspec.types import COUNT_FIELDS

# ---------------------------------------------------------------------------- submit


def create_job(
    session: Session,
    *,
    job_id: str,
    name: str | None,
    method: str,
    input_format: str,
    queue: str,
    config: dict,
    manifest: dict,
    items: Iterable[dict],
    batch_size: int = 2000,
    status: str = "pending",
) -> int:
    """Insert the job and its items (dicts with seq, line, item_id, request and optionally
    sample) in batches.
    Nothing is committed here: the caller commits once, so a failure leaves no rows."""
    session.add(
        Job(
            id=job_id, name=name, status=status, method=method, input_format=input_format,
            queue=queue, n_items=0, config=config, manifest=manifest, created_at=utcnow(),
        )
    )
    session.flush()
    if session.get_bind().dialect.name == "postgresql":
        n = _copy_items(session, job_id, items, batch_size)
    else:
        n = 0
        batch: list[dict] = []
        stmt = insert(Item)
        for row in items:
            row.update(job_id=job_id, status="pending", attempts=0)
            batch.append(row)
            if len(batch) >= batch_size:
                session.execute(stmt, batch)
                n += len(batch)
                batch = []
        if batch:
            session.execute(stmt, batch)
            n += len(batch)
    session.execute(update(Job).where(Job.id == job_id).values(n_items=n))
    return n


def _copy_items(session: Session, job_id: str, items: Iterable[dict], batch_size: int) -> int:
    """Postgres bulk path: COPY ... FROM STDIN, streamed (rows are written as they come)."""
    dbapi_conn = session.connection().connection.driver_connection
    n = 0
    with dbapi_conn.cursor() as cur:
        with cur.copy(
            "COPY items (job_id, seq, line, item_id, sample, status, attempts, request) FROM STDIN"
        ) as copy:
            for row in items:
                copy.write_row((job_id, row["seq"], row["line"], row["item_id"], row.get("sample", 0),
                                "pending", 0, json.dumps(row["request"], ensure_ascii=False)))
                n += 1
    return n


def item_labels(session: Session, job_id: str, seqs: Iterable[int] | None = None) -> dict[int, str]:
    """Position -> the item's input id as people read it ("id", or "id#k" for sample k > 0),
    of the job's items at ``seqs`` (default: all)."""
    stmt = select(Item.seq, Item.item_id, Item.sample).where(Item.job_id == job_id)
    if seqs is not None:
        stmt = stmt.where(Item.seq.in_(list(seqs)))
    return {seq: f"{item_id}#{sample}" if sample else item_id for seq, item_id, sample in session.execute(stmt)}


def set_job_status(session: Session, job_id: str, status: str, *, only_from: Iterable[str]) -> bool:
    res = session.execute(
        update(Job).where(Job.id == job_id, Job.status.in_(tuple(only_from))).values(status=status)
    )
    return res.rowcount > 0


def pending_seqs(session: Session, job_id: str) -> list[int]:
    return list(
        session.scalars(
            select(Item.seq).where(Item.job_id == job_id, Item.status == "pending").order_by(Item.seq)
        )
    )


# ---------------------------------------------------------------------------- worker side


@dataclass
class Claim:
    pk: int
    seq: int
    attempts: int
    request: dict
    sample: int = 0
    item_id: str = ""  # the input's id, as text: the samples of one input share it


def get_job(session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)


def mark_job_running(session: Session, job_id: str, identities: dict | None = None) -> None:
    """The job runs (from pending or queued); `identities` go into its manifest once. Not
    committed."""
    session.connection().execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(("pending", "queued")))
        .values(status="running", started_at=func.coalesce(Job.started_at, utcnow()))
    )
    if identities:
        job = session.get(Job, job_id)
        if job is not None and not job.manifest.get("identities"):
            job.manifest = {**job.manifest, "identities": identities}


def hold_items(session: Session, job_id: str, seqs: list[int], worker: str) -> None:
    """Mark the chunk's pending items as held by `worker`, so they are re-enqueued if it dies
    before reaching them (the dead worker's chunk message only comes back after the
    visibility timeout). Not committed."""
    session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.seq.in_(seqs), Item.status == "pending")
        .values(worker=worker)
    )


def release_items(session: Session, job_id: str, seqs: list[int], worker: str) -> None:
    """Drop `worker`'s hold on pending items it hands back to the queue itself (a chunk cut
    short), so its later death does not re-enqueue them a second time. Not committed."""
    session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.seq.in_(seqs), Item.status == "pending",
               Item.worker == worker)
        .values(worker=None)
    )


def _beating(session: Session, dead_after_s: float):
    """Workers that beat within `dead_after_s`, by the database's clock. (SQLite has no
    interval arithmetic: its own datetime() gives the cutoff in the text form it stores.)"""
    if session.get_bind().dialect.name == "sqlite":
        return Worker.heartbeat_at >= func.datetime("now", f"-{dead_after_s:f} seconds")
    return Worker.heartbeat_at >= func.now() - timedelta(seconds=dead_after_s)


def beats(session: Session, worker_name, dead_after_s: float):
    """Whether the worker named by `worker_name` (a column or a value) still beats."""
    return exists().where(Worker.name == worker_name, _beating(session, dead_after_s))


def claim_item(session: Session, job_id: str, seq: int, worker: str | None,
               dead_after_s: float | None = None) -> Claim | None:
    """Claim one item for processing; None when it is finished, cancelled, its job was
    cancelled (the cooperative-cancel check, folded into the same statement), or, given
    `dead_after_s`, when another worker that still beats is running it (the broker handed
    out a chunk that outlived its visibility timeout: the first worker finishes the item,
    and should it die, the reaper hands the item out again)."""
    job_live = exists().where(Job.id == job_id, Job.status != "cancelled")
    not_held_by_the_living = (
        Item.status == "pending",
        Item.worker.is_(None),
        Item.worker == worker,
        ~beats(session, Item.worker, dead_after_s),
    ) if dead_after_s is not None else (Item.status.in_(("pending", "running")),)
    row = session.connection().execute(
        update(Item)
        .where(
            Item.job_id == job_id,
            Item.seq == seq,
            Item.status.in_(("pending", "running")),
            or_(*not_held_by_the_living),
            job_live,
        )
        .values(
            status="running",
            attempts=Item.attempts + 1,
            started_at=utcnow(),
            worker=worker,
        )
        .returning(Item.id, Item.attempts, Item.request, Item.sample, Item.item_id)
    ).first()
    session.commit()
    if row is None:
        return None
    return Claim(pk=row[0], seq=seq, attempts=row[1], request=row[2], sample=row[3], item_id=row[4])


def cancel_leftovers(session: Session, job_id: str, seqs: Iterable[int]) -> int:
    """Mark the given not-finished items of a cancelled job as cancelled."""
    res = session.execute(
        update(Item)
        .where(
            Item.job_id == job_id,
            Item.seq.in_(list(seqs)),
            Item.status.in_(("pending", "running")),
            exists().where(Job.id == job_id, Job.status == "cancelled"),
        )
        .values(status="cancelled", finished_at=utcnow())
    )
    session.commit()
    return res.rowcount


def cancel_running(session: Session, pk: int, worker: str) -> bool:
    """Mark item `pk` cancelled: `worker` stopped decoding it because its job was cancelled.
    Only while it is running and still `worker`'s: an item the reaper has handed to another
    worker meanwhile is that worker's to settle."""
    res = session.execute(
        update(Item)
        .where(Item.id == pk, Item.status == "running", Item.worker == worker)
        .values(status="cancelled", finished_at=utcnow())
    )
    session.commit()
    return res.rowcount > 0


def job_is_cancelled(session: Session, job_id: str) -> bool:
    return session.scalar(select(Job.status).where(Job.id == job_id)) == "cancelled"


def fail_item(session: Session, pk: int, error: str, worker: str) -> bool:
    """Mark item `pk` failed with `error`, committed, if it is running and still `worker`'s:
    an item the reaper has handed to another worker meanwhile is that worker's to settle.
    False when it was not (the caller's failure came late)."""
    res = session.execute(
        update(Item)
        .where(Item.id == pk, Item.status == "running", Item.worker == worker)
        .values(status="failed", error=error[:10_000], finished_at=utcnow())
    )
    session.commit()
    return res.rowcount > 0


def item_status(session: Session, pk: int) -> str | None:
    return session.scalar(select(Item.status).where(Item.id == pk))


def fail_pending(session: Session, job_id: str, seqs: Iterable[int], error: str) -> int:
    """Mark the given items failed with ``error`` (committed; how many), only those pending
    and held by no worker. The caller cannot serve them (its engine does not load) and holds
    none; an item another worker holds is in that worker's chunk, whose engine loaded, and
    is that worker's to run or hand back (docs/service.md, "Workers that die"). One
    statement: a hold or claim committed first makes it skip the item."""
    res = session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.seq.in_(list(seqs)), Item.status == "pending",
               Item.worker.is_(None))
        .values(status="failed", error=error[:10_000], finished_at=utcnow())
    )
    session.commit()
    return res.rowcount


def failure_reasons(session: Session, job_id: str, limit: int = 3) -> list[tuple[str, int]]:
    """The job's most common reasons for failed items, with how many items each failed."""
    n = func.count().label("n")
    rows = session.execute(
        select(Item.error, n).where(Item.job_id == job_id, Item.status == "failed")
        .group_by(Item.error).order_by(n.desc()).limit(limit)
    )
    return [(error or "(no reason recorded)", count) for error, count in rows]


def storable_text(text: str | None) -> str | None:
    """A model's text as a text column holds it: Postgres refuses U+0000 (NUL) in text, which a
    byte-level tokenizer's token for byte 0 decodes to (the input's NUL is refused at
    validation, a model's is not the submitter's to fix), so it becomes U+FFFD, as a decoder
    writes bytes it cannot show; on every database, so that their exports agree."""
    return text.replace("\x00", "\ufffd") if text is not None else None


def output_values(result: Any, correct: bool | None) -> dict[str, Any]:
    """A GenerationResult's outputs row (without the keys and the time)."""
    texts = {key: storable_text(getattr(result, key)) for key in ("text", "final_answer", "reasoning", "content")}
    return {**texts, "correct": correct, "kept": is_kept(correct, result.final_answer, result.finish_reason),
            "finish_reason": result.finish_reason, "models": dict(result.models or {})}


def save_result(session: Session, job_id: str, pk: int, result: Any, correct: bool | None = None) -> bool:
    """Store a GenerationResult for item `pk` in one transaction, committed; `correct`:
    its final answer checked against the input's reference. Only while the item is running:
    False, and nothing written, when another delivery already stored one or the item was
    settled otherwise meanwhile (cancelled, failed). Any delivery's result is stored, not
    only the latest claimer's: the first to finish wins (the output's key is the item)."""
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        return _save_result_pg(session, conn, job_id, pk, result, correct)
    try:
        # First: the guard, and (SQLite) the write lock, so nothing settles it meanwhile.
        settled = conn.execute(
            update(Item)
            .where(Item.id == pk, Item.status == "running")
            .values(status="done", error=None, finished_at=utcnow())
        )
        if settled.rowcount != 1:
            session.rollback()
            return False
        conn.execute(
            insert(Output).values(item_pk=pk, job_id=job_id, created_at=utcnow(),
                                  **output_values(result, correct))
        )
        if result.steps:
            conn.execute(
                insert(StepLog),
                [{"item_pk": pk, "job_id": job_id, **step_row(s)} for s in result.steps],
            )
        conn.execute(insert(ItemStats).values(item_pk=pk, job_id=job_id, **stat_values(result)))
        session.commit()
        return True
    except IntegrityError:
        session.rollback()
        return False


# step_log column -> its Postgres type in the JSON the one-statement save unpacks. Every
# column is the StepRecord field of the same name, except step_index (StepRecord.index).
STEP_TYPES = {
    "step_index": "int", "author": "text", "text": "text", "drafted_tokens": "int",
    "accepted_tokens": "int", "decision": "text", "p_target": "float8", "p_draft": "float8",
    "accept_prob": "float8", "seconds": "float8", "target_tokens": "int",
    "draft_text": "text", "judge_score": "int", "reason": "text",
}
STEP_FIELDS = ", ".join(f"{col} {typ}" for col, typ in STEP_TYPES.items())
STEP_MODEL_TEXTS = ("text", "draft_text")  # the step_log columns a model wrote
STEP_COLS = ", ".join(STEP_TYPES)


def step_row(s: Any) -> dict[str, Any]:
    """A StepRecord as step_log column values (without item_pk and job_id)."""
    row = {col: getattr(s, "index" if col == "step_index" else col) for col in STEP_TYPES}
    return {col: storable_text(value) if col in STEP_MODEL_TEXTS else value for col, value in row.items()}


# item_stats columns besides the keys: every engine counter (semspec.types.COUNT_FIELDS)
# between the item's wall time and its step count and phase times.
STAT_SUMS = ("wall_seconds", *COUNT_FIELDS, "n_steps")  # the columns a job's figures add up
STAT_COLS = (*STAT_SUMS, "phase_seconds")


def stat_values(result: Any) -> dict[str, Any]:
    """A GenerationResult's item_stats row (without item_pk and job_id)."""
    c = result.counters
    return {"wall_seconds": result.wall_seconds, **{k: getattr(c, k) for k in COUNT_FIELDS},
            "n_steps": len(result.steps), "phase_seconds": dict(c.phase_seconds)}
# The Postgres path of save_result: the item's status, output, step log and stats in ONE
# statement (one round trip). The guarded update comes first: it locks the item's row, and
# one that a concurrent cancel or failure settled first no longer matches (READ COMMITTED
# re-checks the condition), so nothing else is written. ON CONFLICT DO NOTHING on the output
# keeps a second delivery a no-op; the other inserts only run when the output was inserted.
_SAVE_PG = text(f"""
WITH i AS (
    UPDATE items SET status = 'done', error = NULL, finished_at = :now
    WHERE id = :pk AND status = 'running'
    RETURNING id
), o AS (
    INSERT INTO outputs (item_pk, job_id, text, final_answer, reasoning, content, correct, kept,
                         finish_reason, models, created_at)
    SELECT :pk, :job_id, :text, :final_answer, :reasoning, :content, :correct, :kept,
           :finish_reason, CAST(:models AS json), :now
    WHERE EXISTS (SELECT 1 FROM i)
    ON CONFLICT (item_pk) DO NOTHING
    RETURNING item_pk
), s AS (
    INSERT INTO step_log (item_pk, job_id, {STEP_COLS})
    SELECT :pk, :job_id, {STEP_COLS}
    FROM json_to_recordset(CAST(:steps AS json)) AS x({STEP_FIELDS})
    WHERE EXISTS (SELECT 1 FROM o)
), st AS (
    INSERT INTO item_stats (item_pk, job_id, {", ".join(STAT_COLS)})
    SELECT :pk, :job_id, {", ".join(f":{k}" for k in STAT_SUMS)}, CAST(:phase_seconds AS json)
    WHERE EXISTS (SELECT 1 FROM o)
)
SELECT item_pk FROM o
""")


def _save_result_pg(session: Session, conn, job_id: str, pk: int, result: Any, correct: bool | None) -> bool:
    steps = [step_row(s) for s in result.steps]
    stats = stat_values(result)
    stats["phase_seconds"] = json.dumps(stats["phase_seconds"])
    out = output_values(result, correct)
    out["models"] = json.dumps(out["models"])
    stored = conn.execute(_SAVE_PG, {
        "pk": pk, "job_id": job_id, **out, "now": utcnow(), "steps": json.dumps(steps), **stats,
    }).first() is not None
    session.commit()
    return stored


def finalize_job(session: Session, job_id: str) -> bool:
    """End of a chunk: make this worker's item commits durable, then mark the job completed
    when no item is pending or running. Call it before the task is acknowledged.

    Two transactions, in this order: this chunk's results must be committed *before* the
    completion check, or two workers finishing their last items at the same moment would
    each see the other's item still running and neither would complete the job."""
    pg = session.get_bind().dialect.name == "postgresql"
    if pg:
        # A synchronous commit flushes the WAL of every earlier asynchronous commit too;
        # txid_current() makes sure this transaction writes a commit record to wait for.
        session.execute(text("SET LOCAL synchronous_commit = on; SELECT txid_current()"))
    session.commit()
    if pg:  # durable only when it changes something (no transaction id otherwise)
        session.execute(text("SET LOCAL synchronous_commit = on"))
    busy = exists().where(Item.job_id == job_id, Item.status.in_(("pending", "running")))
    res = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(JOB_ACTIVE), ~busy)
        .values(status="completed", finished_at=utcnow())
    )
    session.commit()
    return res.rowcount > 0


# ---------------------------------------------------------------------------- worker liveness


def beat(session: Session, worker: str) -> None:
    """Worker `worker` is alive now, by the database's clock (one clock for every host)."""
    now = func.now()
    res = session.execute(update(Worker).where(Worker.name == worker).values(heartbeat_at=now))
    if res.rowcount == 0:  # first beat, or the row was reaped while this process was stalled
        session.execute(insert(Worker).values(name=worker, started_at=now, heartbeat_at=now))
    session.commit()


@dataclass
class Released:
    workers: list[str] = field(default_factory=list)  # dead workers, whose rows are deleted
    items: dict[str, list[int]] = field(default_factory=dict)  # job id -> seqs, now pending
    # calibration id -> question ids they were collecting, now pending (semjobs.jobs.calibration)
    questions: dict[str, list[str]] = field(default_factory=dict)


def live_workers(session: Session, dead_after_s: float) -> int:
    """How many workers beat within `dead_after_s`."""
    return session.scalar(select(func.count()).select_from(Worker).where(_beating(session, dead_after_s)))


def held_by(session: Session, worker: str) -> list[tuple[str, int]]:
    """(job id, position) of the unfinished items the database says `worker` holds."""
    return [tuple(r) for r in session.execute(
        select(Item.job_id, Item.seq).where(Item.worker == worker, Item.status.in_(("pending", "running")))
    ).all()]


def release_held(session: Session, worker: str, keys: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """Make these items of `worker` pending and unheld, if it still holds them; job id ->
    positions released. Not committed: the caller enqueues them, then commits."""
    released: dict[str, list[int]] = {}
    by_job: dict[str, list[int]] = {}
    for job_id, seq in keys:
        by_job.setdefault(job_id, []).append(seq)
    for job_id, seqs in sorted(by_job.items()):
        rows = session.execute(
            update(Item)
            .where(Item.job_id == job_id, Item.seq.in_(seqs), Item.worker == worker,
                   Item.status.in_(("pending", "running")))
            .values(status="pending", worker=None)
            .returning(Item.seq)
        ).all()
        if rows:
            released[job_id] = sorted(r[0] for r in rows)
    return released


def worker_names(session: Session, prefix: str) -> list[str]:
    """Names of the workers that beat under a name starting with `prefix`."""
    return list(session.scalars(select(Worker.name).where(Worker.name.startswith(prefix, autoescape=True))))


def release_dead_workers(session: Session, dead_after_s: float, gone: Iterable[str] = ()) -> Released:
    """Workers silent for `dead_after_s`, and those named in `gone` (known dead by other
    means), are dead: the calibration questions they were collecting become pending and
    unheld, and their pending and running items become
    pending and unheld (attempts are kept, so the attempt cap still counts deliveries), and
    their rows are deleted. Not committed: the caller enqueues the items, then commits.

    Exactly once under concurrent reapers: a dead worker's row is locked with SKIP LOCKED,
    so a second reaper passes over it (and finds it deleted after the commit), and the item
    update is conditional on the item still being held by that worker."""
    dead = list(session.scalars(
        select(Worker.name).where(or_(~_beating(session, dead_after_s), Worker.name.in_(list(gone))))
        .order_by(Worker.name).with_for_update(skip_locked=True)
    ))
    released = Released(workers=dead)
    if not dead:
        return released
    rows = session.execute(
        update(Item)
        .where(Item.worker.in_(dead), Item.status.in_(("pending", "running")))
        .values(status="pending", worker=None)
        .returning(Item.job_id, Item.seq)
    ).all()
    for job_id, seq in sorted(rows):
        released.items.setdefault(job_id, []).append(seq)
    questions = session.execute(
        update(CalibrationQuestion)
        .where(CalibrationQuestion.worker.in_(dead), CalibrationQuestion.status == "running")
        .values(status="pending", worker=None)
        .returning(CalibrationQuestion.calibration_id, CalibrationQuestion.question_id)
    ).all()
    for cal_id, qid in sorted(questions):
        released.questions.setdefault(cal_id, []).append(qid)
    session.execute(delete(Worker).where(Worker.name.in_(dead)))
    return released


# ---------------------------------------------------------------------------- user commands


def cancel_job(session: Session, job_id: str) -> int:
    """Cancel a job: pending items become cancelled now; the workers decoding running ones
    notice within a second or so and abort them (semjobs.worker.process)."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(JOB_ACTIVE))
        .values(status="cancelled", finished_at=utcnow())
    )
    res = session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.status == "pending")
        .values(status="cancelled", finished_at=utcnow())
    )
    session.commit()
    return res.rowcount


class JobCancelled(Exception):
    """A retry of a cancelled job: its cancel stands, nothing was changed."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} is cancelled")
        self.job_id = job_id


def reset_failed(session: Session, job_id: str) -> list[int]:
    """Failed items back to pending (attempts reset); the job becomes queued again.
    Raises JobCancelled, changing nothing, when the job was cancelled: a retry must not
    bring it back. The job's row is locked first (Postgres), so a cancel at the same moment
    either commits first (refused here) or waits and then cancels the items reset here."""
    status = session.scalar(select(Job.status).where(Job.id == job_id).with_for_update())
    if status == "cancelled":
        session.rollback()
        raise JobCancelled(job_id)
    seqs = list(
        session.scalars(
            update(Item)
            .where(Item.job_id == job_id, Item.status == "failed")
            .values(status="pending", attempts=0, error=None, started_at=None, finished_at=None, worker=None)
            .returning(Item.seq)
        )
    )
    if seqs:
        session.execute(
            update(Job).where(Job.id == job_id).values(status="queued", finished_at=None)
        )
    session.commit()
    return sorted(seqs)


def list_jobs(session: Session, limit: int = 20) -> list[Job]:
    return list(session.scalars(select(Job).order_by(Job.created_at.desc()).limit(limit)))


def counts(session: Session, job_id: str) -> dict[str, int]:
    out = dict.fromkeys(ITEM_STATUSES, 0)
    for status, n in session.execute(
        select(Item.status, func.count()).where(Item.job_id == job_id).group_by(Item.status)
    ):
        out[status] = n
    return out


def stat_sums(session: Session, job_id: str) -> dict[str, float]:
    cols = [func.coalesce(func.sum(getattr(ItemStats, k)), 0) for k in STAT_SUMS]
    row = session.execute(select(*cols).where(ItemStats.job_id == job_id)).one()
    return dict(zip(STAT_SUMS, row))


def last_finished_at(session: Session, job_id: str) -> datetime | None:
    """When the job's last item was settled (done, failed, or found unneeded or over budget)."""
    return as_utc(
        session.scalar(
            select(func.max(Item.finished_at)).where(Item.job_id == job_id,
                                                     Item.status.in_(("done", "failed", "unneeded", "over_budget")))
        )
    )


def as_utc(ts: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything stored is UTC."""
    if ts is not None and ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return ts


def iter_export(session: Session, job_id: str, batch: int = 1000) -> Iterator[tuple]:
    """(item, output | None, stats | None) in input order, streamed."""
    stmt = (
        select(Item, Output, ItemStats)
        .outerjoin(Output, Output.item_pk == Item.id)
        .outerjoin(ItemStats, ItemStats.item_pk == Item.id)
        .where(Item.job_id == job_id)
        .order_by(Item.seq)
        .execution_options(yield_per=batch)
    )
    for item, out, stats in session.execute(stmt):
        yield item, out, stats


def answer_totals(session: Session, job_id: str) -> tuple[int, int, int]:
    """(outputs checked against a reference, how many correct, the most checked samples of
    one input), counted in the database."""
    per_input = (
        select(Item.item_id, func.count().label("n"),
               func.sum(case((Output.correct.is_(True), 1), else_=0)).label("right"))
        .join(Output, Output.item_pk == Item.id)
        .where(Item.job_id == job_id, Output.correct.is_not(None))
        .group_by(Item.item_id)
        .subquery()
    )
    n, right, most = session.execute(
        select(func.coalesce(func.sum(per_input.c.n), 0), func.coalesce(func.sum(per_input.c.right), 0),
               func.coalesce(func.max(per_input.c.n), 0))
    ).one()
    return int(n), int(right), int(most)


def answers(session: Session, job_id: str) -> Iterator[tuple]:
    """(input id, sample, final answer, correct) of every finished item, in input order."""
    stmt = (
        select(Item.item_id, Item.sample, Output.final_answer, Output.correct)
        .join(Output, Output.item_pk == Item.id)
        .where(Item.job_id == job_id)
        .order_by(Item.seq)
    )
    yield from session.execute(stmt)


def steps_for(session: Session, item_pk: int) -> list[StepLog]:
    return list(
        session.scalars(select(StepLog).where(StepLog.item_pk == item_pk).order_by(StepLog.step_index))
    )


@dataclass
class StepCounts:
    """A job's step log counted by the database, for reports: a job of a million items logs
    tens of millions of steps, which a report must not load. Each maps a group to its steps."""

    # (step index, capped at the max_position asked for, decision)
    by_position: dict[tuple[int, str], int]
    # (author, decision, target tokens) of steps whose target-token count is known and > 0
    by_length: dict[tuple[str, str, int], int]
    by_reason: dict[tuple[str, str | None], int]  # (decision, reason)


def step_counts(session: Session, job_id: str, max_position: int) -> StepCounts:
    """The job's logged steps grouped three ways (``StepCounts``), in three GROUP BY queries."""
    mine = StepLog.job_id == job_id
    position = case((StepLog.step_index > max_position, max_position), else_=StepLog.step_index)

    def grouped(*columns, where=mine):
        rows = session.execute(select(*columns, func.count()).where(where).group_by(*columns))
        return {tuple(row[:-1]): int(row[-1]) for row in rows}

    return StepCounts(
        by_position=grouped(position, StepLog.decision),
        by_length=grouped(StepLog.author, StepLog.decision, StepLog.target_tokens,
                          where=mine & (StepLog.target_tokens > 0)),
        by_reason=grouped(StepLog.decision, StepLog.reason),
    )


def completions(session: Session, job_id: str) -> list[tuple]:
    """(finished at, generated tokens, wall seconds) of the job's finished items, in the order
    they finished."""
    rows = session.execute(
        select(Item.finished_at, ItemStats.generated_tokens, ItemStats.wall_seconds)
        .join(ItemStats, ItemStats.item_pk == Item.id)
        .where(Item.job_id == job_id, Item.status == "done")
        .order_by(Item.finished_at)
    )
    return [(as_utc(ts), n, wall) for ts, n, wall in rows]


def jobs_with_unheld_pending(session: Session) -> list[tuple[str, str, str]]:
    """(job id, queue, job status) of active jobs with pending items no worker holds: each such
    item is in the broker's queue, or in a message the broker lost, or (a job still `pending`)
    in none yet: its submit is enqueueing it, or died before it did (semjobs.worker.orphans)."""
    return [tuple(r) for r in session.execute(
        select(Item.job_id, Job.queue, Job.status).join(Job, Job.id == Item.job_id)
        .where(Job.status.in_(JOB_ACTIVE), Item.status == "pending", Item.worker.is_(None))
        .group_by(Item.job_id, Job.queue, Job.status)
    )]


def unheld_pending_seqs(session: Session, job_id: str) -> list[int]:
    return list(session.scalars(
        select(Item.seq).where(Item.job_id == job_id, Item.status == "pending", Item.worker.is_(None))
        .order_by(Item.seq)
    ))


def count_lost_delivery(session: Session, job_id: str, seqs: list[int], max_attempts: int) -> list[int]:
    """The broker lost these pending items' message: that counts as a delivery. Items past
    `max_attempts` fail with the reason; the others' positions are returned, to enqueue
    again. Not committed."""
    now = utcnow()
    session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.seq.in_(seqs), Item.status == "pending", Item.worker.is_(None),
               Item.attempts + 1 > max_attempts)
        .values(status="failed", attempts=Item.attempts + 1, finished_at=now,
                error=f"its message was lost by the broker more than max_attempts={max_attempts} times in all")
    )
    again = session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.seq.in_(seqs), Item.status == "pending", Item.worker.is_(None))
        .values(attempts=Item.attempts + 1)
        .returning(Item.seq)
    ).scalars().all()
    return sorted(again)


def try_lock(session: Session, key: int) -> bool:
    """A transaction-scoped advisory lock on Postgres (True when taken); always True elsewhere."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(session.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": key}))

"""Samples an input no longer needs: a job that wants K kept samples of an input (`--want`)
stops decoding its other samples once K are kept (`semspec.answers.is_kept`, stored as
outputs.kept). The database is the one place that knows what every input has, whichever
worker stored it, so workers ask it: before they decode a claimed sample, and while their
samples decode (those of a satisfied input are aborted at their next step).

An unneeded sample ends in its own state, apart from failed and cancelled; the tokens it had
generated before it was aborted are stored as its item_stats' cut_tokens, so a job's spent
tokens count them.
"""

from __future__ import annotations

from typing import Iterable

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from semjobs.db.models import Item, ItemStats, Job, Output, utcnow
from semspec.types import COUNT_FIELDS


def satisfied(session: Session, job_id: str, wants: dict[str, int]) -> set[str]:
    """The input ids of ``wants`` (input id -> kept samples wanted) that have at least as
    many kept samples stored."""
    if not wants:
        return set()
    kept = session.execute(
        select(Item.item_id, func.count())
        .join(Output, Output.item_pk == Item.id)
        .where(Item.job_id == job_id, Item.item_id.in_(list(wants)), Output.kept.is_(True))
        .group_by(Item.item_id)
    )
    return {item_id for item_id, n in kept if n >= wants[item_id]}


def spent_tokens(session: Session, job_id: str) -> int:
    """Tokens the job has generated so far: in its outputs, cut from them, and spent on
    samples aborted as unneeded (what a token budget counts)."""
    return int(session.scalar(select(func.coalesce(func.sum(ItemStats.generated_tokens + ItemStats.cut_tokens), 0))
                              .where(ItemStats.job_id == job_id)))


def settle_unneeded(session: Session, job_id: str, pk: int, worker: str, spent_tokens: int = 0,
                    status: str = "unneeded") -> bool:
    """Mark item ``pk`` ``status`` ("unneeded", or "over_budget"): ``worker`` holds it
    running and found its input satisfied (or the job's budget spent), before decoding it or
    after aborting it with ``spent_tokens`` generated. Committed; False, and nothing written,
    when the item was settled otherwise or handed to another worker meanwhile."""
    res = session.execute(
        update(Item)
        .where(Item.id == pk, Item.status == "running", Item.worker == worker)
        .values(status=status, finished_at=utcnow())
    )
    if res.rowcount != 1:
        session.rollback()
        return False
    if spent_tokens:
        zeros = dict.fromkeys(COUNT_FIELDS, 0)
        session.execute(insert(ItemStats).values(item_pk=pk, job_id=job_id, wall_seconds=0.0, n_steps=0,
                                                 phase_seconds={}, **{**zeros, "cut_tokens": spent_tokens}))
    session.commit()
    return True


def kept_by_input(session: Session, job_id: str) -> Iterable[tuple[str, int, int]]:
    """(input id, samples stored, kept samples) of every input of the job with a stored sample."""
    return session.execute(
        select(Item.item_id, func.count(), func.count().filter(Output.kept.is_(True)))
        .join(Output, Output.item_pk == Item.id)
        .where(Item.job_id == job_id)
        .group_by(Item.item_id)
    ).all()


def work_order(session: Session, job_id: str, seqs: list[int]) -> list[int]:
    """``seqs`` in the order they should decode. A job whose inputs want some kept samples
    goes in waves: every input's first sample, then every input's second, and so on, so an
    input's next sample starts only once its earlier ones have (mostly) finished, and is not
    decoded when they were enough; so does a job with a token budget, so that what it spends
    first covers every input once. Other jobs keep an input's samples adjacent (their prompt
    is prefilled once)."""
    job = session.get(Job, job_id)
    if job is None or not (job.manifest.get("in_waves") or job.manifest.get("budget_tokens")):
        return list(seqs)
    wanted = set(seqs)
    rows = select(Item.seq, Item.sample).where(Item.job_id == job_id)
    if len(wanted) <= 1000:  # a chunk handed back, a few re-enqueued: read only theirs
        rows = rows.where(Item.seq.in_(wanted))
    sample_of = dict(session.execute(rows).all())
    return sorted(wanted, key=lambda seq: (sample_of.get(seq, 0), seq))


def spend_by_finish(session: Session, job_id: str) -> dict[str, tuple[int, int]]:
    """Item status, or a done item's finish reason -> (items, tokens spent on them: generated
    and cut), over the job's items with stats (done ones, and those aborted as unneeded)."""
    key = func.coalesce(Output.finish_reason, Item.status)
    rows = session.execute(
        select(key, func.count(), func.coalesce(func.sum(ItemStats.generated_tokens + ItemStats.cut_tokens), 0))
        .select_from(ItemStats)
        .join(Item, Item.id == ItemStats.item_pk)
        .outerjoin(Output, Output.item_pk == ItemStats.item_pk)
        .where(ItemStats.job_id == job_id)
        .group_by(key)
    )
    return {k: (int(n), int(tokens)) for k, n, tokens in rows}


def line_wants(session: Session, job: Job) -> dict[str, int]:
    """The kept samples wanted by the inputs of ``job`` whose line has a `want` of its own
    (over the job's); read only when some line has one."""
    if not job.manifest.get("line_wants"):
        return {}
    rows = session.execute(select(Item.item_id, Item.request).where(Item.job_id == job.id, Item.sample == 0))
    return {item_id: request["want"] for item_id, request in rows if request.get("want")}

"""Job progress from the database: counts by state, tokens, tokens/s, acceptance, ETA.

Raw counts are stored; every ratio here is derived and named for what it is:
- tokens_per_s: generated tokens / seconds since the job started (service throughput);
- decode_tokens_per_s: generated tokens / summed per-item wall time (engine speed);
- step_acceptance: accepted drafted steps / drafted steps;
- token_acceptance: accepted drafted tokens / drafted tokens (no bonus tokens counted);
- answers: accuracy, pass@k and majority-vote accuracy where inputs had references
  (`semjobs.jobs.accuracy`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from semjobs.db import repo, surplus
from semjobs.jobs import accuracy
from semjobs.db.models import JOB_ACTIVE
from semjobs.db.session import session_factory
from semjobs.settings import settings
from semjobs.worker.queues import EMBEDDED_QUEUE


def _iso(ts: datetime | None) -> str | None:
    ts = repo.as_utc(ts)
    return ts.isoformat() if ts else None


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def _answers(session, job_id: str) -> dict[str, Any] | None:
    """The job's answer figures (semjobs.jobs.accuracy). With one sample per input they all equal
    the accuracy, counted in the database; with several, each input's samples are read."""
    checked, right, most = repo.answer_totals(session, job_id)
    if checked == 0:
        return None
    if most > 1:
        return accuracy.summary(accuracy.Answer(*row) for row in repo.answers(session, job_id))
    acc = round(right / checked, 4)
    return {"inputs": checked, "samples_checked": checked, "accuracy": acc, "pass_at_k": {"1": acc},
            "majority_accuracy": acc}


PASS_RATE_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)  # upper edges: 0, (0, .25], ..., (.75, 1]


def pass_rate_histogram(per_input: list[tuple[str, int, int]]) -> dict[str, int]:
    """Inputs by the share of their finished samples kept, in PASS_RATE_BINS."""
    hist = dict.fromkeys((f"<={edge:g}" for edge in PASS_RATE_BINS), 0)
    for _, stored, kept in per_input:
        rate = kept / stored if stored else 0.0
        edge = next(e for e in PASS_RATE_BINS if rate <= e)
        hist[f"<={edge:g}"] += 1
    return hist


def saved_tokens(spend: dict[str, tuple[int, int]], counts: dict[str, int], max_new_tokens: int) -> dict[str, int]:
    """What each rule spared, estimated: a loop cut would have run to the cap (max_new_tokens
    a sample); a sample not decoded (unneeded, over budget) would have cost what a finished
    sample of the job cost on average, less what an aborted one had spent."""
    finished = [spend[k] for k in spend if k not in ("unneeded", "over_budget")]
    n = sum(items for items, _ in finished)
    mean = sum(tokens for _, tokens in finished) / n if n else 0.0
    loops, loop_tokens = spend.get("repetition", (0, 0))
    aborted = spend.get("unneeded", (0, 0))[1]
    return {
        "loops": max(0, loops * max_new_tokens - loop_tokens),
        "unneeded": max(0, round(counts["unneeded"] * mean) - aborted),
        "over_budget": round(counts["over_budget"] * mean),
    }


def _kept(session, job, spent_tokens: int) -> dict[str, Any]:
    """What the job's samples are worth to its dataset: kept samples (semspec.answers.is_kept),
    useful ones (kept, at most what each input wants: what a dataset of it holds), inputs
    with at least one kept (covered) and with all they want (full: None when none wants),
    and the tokens spent for them (generated, cut from loops and spent on samples aborted
    as unneeded)."""
    want = job.manifest.get("want_per_input")
    own = surplus.line_wants(session, job)
    stored = surplus.kept_by_input(session, job.id)
    kept = [(k, own.get(item_id, want)) for item_id, _, k in stored]  # (kept, wanted) per input
    useful = sum(min(k, w) if w else k for k, w in kept)
    return {
        "want": want,
        "budget_tokens": job.manifest.get("budget_tokens"),
        "kept": sum(k for k, _ in kept),
        "useful": useful,
        "inputs": job.manifest.get("input", {}).get("items"),
        "covered_inputs": sum(k > 0 for k, _ in kept),
        # an input with nothing stored is not full, whatever it wants
        "full_inputs": sum(bool(w) and k >= w for k, w in kept) if want is not None or own else None,
        "spent_tokens": spent_tokens,
        "tokens_per_useful": _ratio(spent_tokens, useful),
        "pass_rates": pass_rate_histogram(stored),
    }


def _stalled(job, counts: dict[str, int], quiet_s: float, mean_gap_s: float | None,
             live_workers: int) -> str | None:
    """Why an active job makes no progress, or None while it does: no item finished for
    `settings.stall_after_s` (or five mean gaps between finishes, if longer)."""
    remaining = counts["pending"] + counts["running"]
    if job.status not in JOB_ACTIVE or not remaining:
        return None
    if quiet_s < max(settings.stall_after_s, 5 * (mean_gap_s or 0)):
        return None
    quiet = f"no item finished for {fmt_duration(quiet_s)}"
    if job.queue == EMBEDDED_QUEUE:
        return f"{quiet}: if the `semjobs run` that ran it has stopped, running it again resumes the job"
    if live_workers == 0:
        return f"{quiet} and no worker beats: start `semjobs worker` (queue {job.queue})"
    if counts["running"]:
        return (f"{quiet} though {live_workers} worker(s) beat and {counts['running']} item(s) run: "
                "a worker may hang, or its items take longer than that")
    return (f"{quiet}: {live_workers} worker(s) beat but none takes its {counts['pending']} pending "
            f"item(s); do they serve queue {job.queue}? (messages a broker lost are re-issued "
            "within about a minute; `semjobs retry JOB --pending` re-enqueues them now)")


def job_status(job_id: str, *, url: str | None = None) -> dict[str, Any] | None:
    with session_factory(url)() as session:
        job = repo.get_job(session, job_id)
        if job is None:
            return None
        counts = repo.counts(session, job_id)
        sums = repo.stat_sums(session, job_id)
        last = repo.last_finished_at(session, job_id)
        answers = _answers(session, job_id)
        kept = _kept(session, job, int(sums["generated_tokens"] + sums["cut_tokens"]))
        spend = surplus.spend_by_finish(session, job_id)
        kept["saved_tokens_estimate"] = saved_tokens(spend, counts, job.config.get("max_new_tokens", 0))
        # samples a rule ended before their end: a loop (--stop-loops), the doom rule (--stop-doomed)
        kept["stopped_early"] = {rule: spend.get(reason, (0, 0))[0]
                                 for rule, reason in (("loops", "repetition"), ("doomed", "doomed"))}
        failures = repo.failure_reasons(session, job_id) if counts["failed"] else []
        live = repo.live_workers(session, settings.worker_dead_after_s) if job.status in JOB_ACTIVE else 0
    started = repo.as_utc(job.started_at)
    finished = repo.as_utc(job.finished_at)
    now = datetime.now(timezone.utc)
    end = finished or (now if job.status in JOB_ACTIVE else last or now)
    elapsed = (end - started).total_seconds() if started else 0.0
    gen = int(sums["generated_tokens"])
    # samples found unneeded or over budget settle too (at once: an ETA of a job that wants
    # or budgets is an upper bound)
    settled = counts["done"] + counts["failed"] + counts["unneeded"] + counts["over_budget"]
    remaining = counts["pending"] + counts["running"]
    quiet_since = last or started or repo.as_utc(job.created_at)
    mean_gap = (last - started).total_seconds() / settled if last and started and settled else None
    stalled = _stalled(job, counts, (now - quiet_since).total_seconds(), mean_gap, live)
    eta = None
    if job.status in JOB_ACTIVE and settled and elapsed > 0 and stalled is None:
        eta = round(remaining * elapsed / settled, 1)
    return {
        "id": job.id,
        "name": job.name,
        "status": job.status,
        "method": job.method,
        "queue": job.queue,
        "input_format": job.input_format,
        "n_items": job.n_items,
        "counts": counts,
        "generated_tokens": gen,
        "prompt_tokens": int(sums["prompt_tokens"]),
        "elapsed_s": round(elapsed, 3),
        "tokens_per_s": _ratio(gen, elapsed),
        "decode_tokens_per_s": _ratio(gen, sums["wall_seconds"]),
        "eta_s": eta,
        "stalled": stalled,
        "failures": [{"reason": reason, "items": n} for reason, n in failures],
        "acceptance": {
            "steps_drafted": int(sums["steps_drafted"]),
            "steps_accepted": int(sums["steps_accepted"]),
            "step_acceptance": _ratio(sums["steps_accepted"], sums["steps_drafted"]),
            "drafted_tokens": int(sums["drafted_tokens"]),
            "accepted_tokens": int(sums["accepted_tokens"]),
            "token_acceptance": _ratio(sums["accepted_tokens"], sums["drafted_tokens"]),
            "target_forward_passes": int(sums["target_forward_passes"]),
            "draft_forward_passes": int(sums["draft_forward_passes"]),
        },
        "answers": answers,
        "yield": kept,
        "config": job.config,
        "manifest": job.manifest,
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
    }


def recent_jobs(limit: int = 20, *, url: str | None = None) -> list[dict[str, Any]]:
    """The newest jobs with their counts, throughput, step acceptance and age."""
    now = datetime.now(timezone.utc)
    with session_factory(url)() as session:
        rows = []
        for job in repo.list_jobs(session, limit):
            sums = repo.stat_sums(session, job.id)
            started, finished = repo.as_utc(job.started_at), repo.as_utc(job.finished_at)
            elapsed = ((finished or now) - started).total_seconds() if started else 0.0
            rows.append({
                "id": job.id, "name": job.name, "status": job.status, "method": job.method,
                "n_items": job.n_items, "counts": repo.counts(session, job.id),
                "generated_tokens": int(sums["generated_tokens"]),
                "tokens_per_s": _ratio(sums["generated_tokens"], elapsed),
                "step_acceptance": _ratio(sums["steps_accepted"], sums["steps_drafted"]),
                "created_at": _iso(job.created_at),
                "age_s": round((now - repo.as_utc(job.created_at)).total_seconds(), 1),
            })
    return rows


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def render(st: dict[str, Any]) -> str:
    c, a = st["counts"], st["acceptance"]
    lines = [
        f"job {st['id']}  {st['name'] or ''}".rstrip(),
        f"  status     {st['status']}   method {st['method']}   queue {st['queue']}",
        f"  items      {st['n_items']} total: {c['done']} done, {c['running']} running, "
        f"{c['pending']} pending, {c['failed']} failed, {c['cancelled']} cancelled"
        + "".join(f", {c[s]} {s.replace('_', ' ')}" for s in ("unneeded", "over_budget") if c[s]),
        f"  tokens     {st['generated_tokens']} generated",
        # two rates far apart when items decode side by side: each says what it divides
        f"  tok/s      {st['tokens_per_s'] or 0:.1f} overall (generated / elapsed), "
        f"{st['decode_tokens_per_s'] or 0:.1f} per item (generated / summed item wall times)",
        f"  time       elapsed {fmt_duration(st['elapsed_s'])}, ETA {fmt_duration(st['eta_s'])}",
    ]
    if st["stalled"]:
        lines.append(f"  STALLED    {st['stalled']}")
    for f in st.get("failures") or []:
        lines.append(f"  failed     {f['items']} item(s): {f['reason']}")
    if a["steps_drafted"] or a["drafted_tokens"]:
        sa = a["step_acceptance"]
        ta = a["token_acceptance"]
        lines.append(
            f"  acceptance steps {a['steps_accepted']}/{a['steps_drafted']}"
            f" ({(sa or 0) * 100:.1f}%), drafted tokens {a['accepted_tokens']}/{a['drafted_tokens']}"
            f" ({(ta or 0) * 100:.1f}%)"
        )
    lines.append(
        f"  forward    target {a['target_forward_passes']}, draft {a['draft_forward_passes']}"
    )
    if st.get("answers"):
        # a job that wants K stops an input at its first kept samples: its figures are those of
        # the samples it decoded, not of N samples an input
        early = " (of the samples decoded: an input stops at the kept ones it wants)" \
            if st["yield"].get("full_inputs") is not None else ""
        lines.append(f"  answers    {answers_line(st['answers'])}{early}")
    if st["yield"]["kept"] or st["yield"]["want"]:
        lines.append(f"  kept       {kept_line(st['yield'])}")
    if saved_line(st["yield"]):
        lines.append(f"  spared     {saved_line(st['yield'])}")
    return "\n".join(lines)


def kept_line(y: dict[str, Any]) -> str:
    """The dataset's side of a job: kept and useful samples, inputs covered, tokens per useful one."""
    full = "" if y.get("full_inputs") is None else (
        f", {y['full_inputs']} with " + (f"all {y['want']} wanted" if y["want"] else "all they want"))
    per = f", {y['tokens_per_useful']:.0f} tokens spent per useful sample" if y["tokens_per_useful"] else ""
    stopped = {rule: n for rule, n in (y.get("stopped_early") or {}).items() if n}
    per += "; stopped early: " + ", ".join(f"{n} {rule}" for rule, n in stopped.items()) if stopped else ""
    return (f"{y['kept']} samples kept, {y['useful']} useful; {y['covered_inputs']} of {y['inputs']} inputs "
            f"with one{full}{per}")


def saved_line(y: dict[str, Any]) -> str | None:
    """Tokens each rule spared, estimated (saved_tokens), or None when none did."""
    saved = {rule: n for rule, n in (y.get("saved_tokens_estimate") or {}).items() if n}
    if not saved:
        return None
    return "about " + ", ".join(f"{n} tokens by {rule.replace('_', ' ')}" for rule, n in saved.items())


def answers_line(ans: dict[str, Any]) -> str:
    k = max(ans["pass_at_k"], key=int)
    return (f"{ans['accuracy'] * 100:.1f}% correct of {ans['samples_checked']} checked"
            f" ({ans['inputs']} inputs), pass@{k} {ans['pass_at_k'][k] * 100:.1f}%,"
            f" majority vote {ans['majority_accuracy'] * 100:.1f}%")


def progress_line(st: dict[str, Any], width: int = 30) -> str:
    c = st["counts"]
    total = max(st["n_items"], 1)
    settled = c["done"] + c["failed"] + c["cancelled"] + c["unneeded"] + c["over_budget"]
    filled = int(width * settled / total)
    bar = "#" * filled + "-" * (width - filled)
    acc = st["acceptance"]["step_acceptance"]
    return (
        f"[{bar}] {settled}/{st['n_items']}  done {c['done']} failed {c['failed']}"
        f"  {st['generated_tokens']} tok  {st['tokens_per_s'] or 0:.1f} tok/s overall"
        f"  steps kept {'-' if acc is None else f'{acc:.0%}'}  ETA {fmt_duration(st['eta_s'])}"
        f"  {'STALLED' if st['stalled'] else st['status']}"
    )

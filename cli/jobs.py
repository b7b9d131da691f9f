"""Job commands: submit, status, export, cancel, retry, and the embedded `run`.
Thin: parse, call `jobs`/`db`/`worker`, print."""

from __future__ import annotations

import json
import sys
import time

import click

EXIT_INVALID_INPUT = 2


def generation_options(f):
    f = click.option("--name", default=None, help="Job name (default: the file name).")(f)
    f = click.option("--seed", type=int, default=None, help="Sampling seed.")(f)
    f = click.option("--temperature", type=float, default=None,
                     help="0 = greedy (default from SEMJOBS_TEMPERATURE).")(f)
    f = click.option("--max-new-tokens", type=int, default=None,
                     help="Tokens to generate per item (default from SEMJOBS_MAX_NEW_TOKENS).")(f)
    f = click.option("--method", default=None,
                     help="ar | token_sd | step_judge | semspec (default from SEMJOBS_METHOD).")(f)
    return f


def db_option(f):
    return click.option("--db", "db_url", default=None,
                        help="Database URL (default: SEMJOBS_DATABASE_URL).")(f)


def _config(method, max_new_tokens, temperature, seed) -> dict:
    from jobs.submit import job_config

    try:
        return job_config(method, max_new_tokens, temperature, seed)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--method") from None


def _store(file, config, queue, name, url, status, validation=None):
    from jobs.submit import InvalidInput, store_job

    try:
        return store_job(file, config, queue=queue, name=name, url=url, status=status,
                         validation=validation)
    except InvalidInput as e:
        for line in e.lines():
            click.echo(line, err=True)
        click.echo(f"error: {e}; nothing was stored", err=True)
        sys.exit(EXIT_INVALID_INPUT)


def _require_job(job_id: str, url: str | None) -> dict:
    from jobs.status import job_status

    st = job_status(job_id, url=url)
    if st is None:
        raise click.ClickException(f"no job {job_id!r}")
    return st


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@generation_options
def submit(file, method, max_new_tokens, temperature, seed, name) -> None:
    """Validate FILE, store the job and its items, enqueue them; prints the job id last."""
    from jobs.submit import enqueue_job
    from worker.queues import queue_name

    config = _config(method, max_new_tokens, temperature, seed)
    queue = queue_name()
    t0 = time.perf_counter()
    job_id, n = _store(file, config, queue, name, None, "pending")
    from worker.tasks import publisher

    try:
        with publisher(queue) as send:
            tasks = enqueue_job(job_id, send)
    except Exception as e:  # broker down: the rows are stored, nothing is lost
        click.echo(f"error: job {job_id} stored but not enqueued ({type(e).__name__}: {e}); "
                   f"enqueue it later with `semjobs retry --pending {job_id}`", err=True)
        sys.exit(1)
    click.echo(f"submitted {n} items as {tasks} tasks to queue {queue} "
               f"in {time.perf_counter() - t0:.2f}s")
    click.echo(job_id)


@click.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Show a live progress bar until the job ends.")
@click.option("--interval", type=float, default=1.0, show_default=True)
@click.option("--limit", type=int, default=20, show_default=True, help="Jobs in the table.")
@db_option
def status(job, as_json, watch, interval, limit, db_url) -> None:
    """One job's progress, or a table of recent jobs."""
    from db.models import JOB_ACTIVE
    from jobs.status import progress_line, recent_jobs, render

    if job is None:
        rows = recent_jobs(limit, url=db_url)
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        click.echo(f"{'JOB':<14}{'STATUS':<11}{'DONE':>8}{'FAILED':>8}{'TOTAL':>8}  "
                   f"{'METHOD':<10}{'CREATED':<26}NAME")
        for r in rows:
            c = r["counts"]
            click.echo(f"{r['id']:<14}{r['status']:<11}{c['done']:>8}{c['failed']:>8}"
                       f"{r['n_items']:>8}  {r['method']:<10}{(r['created_at'] or '')[:25]:<26}"
                       f"{r['name'] or ''}")
        return
    st = _require_job(job, db_url)
    if watch:
        tty = sys.stdout.isatty()
        while True:
            line = progress_line(st)
            click.echo(("\r" + line) if tty else line, nl=not tty)
            if st["status"] not in JOB_ACTIVE:
                break
            time.sleep(interval)
            st = _require_job(job, db_url)
        if tty:
            click.echo()
    if as_json:
        click.echo(json.dumps(st, indent=2, default=str))
    else:
        click.echo(render(st))


@click.command()
@click.argument("job")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Results: .jsonl (or .parquet).")
@click.option("--errors", type=click.Path(dir_okay=False), default=None,
              help="Failed/cancelled items (default: OUTPUT's name + .errors.jsonl, "
              "written only when there are any).")
@click.option("--steps", is_flag=True, help="Include the per-step log in each line.")
@db_option
def export(job, output, errors, steps, db_url) -> None:
    """Write one line per finished item, keyed by the input's id."""
    from jobs.export import export_job

    _require_job(job, db_url)
    rep = export_job(job, output, errors, url=db_url, with_steps=steps)
    _print_export(rep)


def _print_export(rep) -> None:
    msg = f"wrote {rep.results} results to {rep.out}"
    if rep.errors:
        msg += f"; {rep.errors} failed/cancelled items to {rep.errors_path}"
    if rep.unfinished:
        msg += f"; {rep.unfinished} items not finished yet"
    if rep.manifest_path:
        msg += f"; manifest {rep.manifest_path}"
    click.echo(msg, err=True)


@click.command()
@click.argument("job")
@db_option
def cancel(job, db_url) -> None:
    """Cancel a job: pending items are dropped, running items finish."""
    from db import repo
    from db.session import session_factory

    _require_job(job, db_url)
    with session_factory(db_url)() as session:
        n = repo.cancel_job(session, job)
    click.echo(f"job {job} cancelled; {n} pending items will not run")


@click.command()
@click.argument("job")
@click.option("--pending", "include_pending", is_flag=True,
              help="Also re-enqueue pending items (e.g. after the broker lost its queue).")
@db_option
def retry(job, include_pending, db_url) -> None:
    """Re-enqueue the job's failed items (only those)."""
    from db import repo
    from db.session import session_factory
    from jobs.submit import enqueue_job
    from worker.tasks import publisher

    st = _require_job(job, db_url)
    with session_factory(db_url)() as session:
        seqs = repo.reset_failed(session, job)
        if include_pending:
            seqs = sorted(set(seqs) | set(repo.pending_seqs(session, job)))
            if seqs:
                repo.set_job_status(session, job, "queued", only_from=("pending", "completed"))
                session.commit()
    if not seqs:
        click.echo(f"job {job}: nothing to retry")
        return
    with publisher(st["queue"]) as send:
        tasks = enqueue_job(job, send, url=db_url, seqs=seqs)
    click.echo(f"job {job}: re-enqueued {len(seqs)} items as {tasks} tasks")


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Results: .jsonl (or .parquet).")
@click.option("--errors", type=click.Path(dir_okay=False), default=None,
              help="Failed items (default: OUTPUT's name + .errors.jsonl, only when any).")
@generation_options
@click.option("--db", "db_url", default=None,
              help="Database URL (default: SEMJOBS_EMBEDDED_DATABASE_URL, a SQLite file).")
@click.option("--steps", is_flag=True, help="Include the per-step log in each output line.")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue an unfinished job of the same file and settings in this "
              "database (after a crash or Ctrl-C) instead of starting a new one.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Items decoded at once (default: SEMJOBS_BATCH_SIZE).")
def run(file, output, errors, method, max_new_tokens, temperature, seed, name, db_url,
        steps, resume, batch_size) -> None:
    """Embedded mode: no servers; process FILE in this process into a SQLite file, then
    export. Same tables, same per-item code as the workers.

    Example: semjobs run examples/prompts.jsonl -o out/results.jsonl --batch-size 16"""
    from db import migrate
    from jobs.export import export_job
    from jobs.schema import validate_file
    from jobs.submit import find_resumable, unfinished_seqs
    from semjobs.settings import settings
    from worker.engine import EngineLoadError
    from worker.process import run_items

    url = db_url or settings.embedded_database_url
    if batch_size is not None:
        settings.batch_size = batch_size
    config = _config(method, max_new_tokens, temperature, seed)
    migrate.upgrade(url)
    validation = validate_file(file, settings.max_line_bytes)
    job_id = find_resumable(validation, config, url=url) if resume and validation.ok else None
    if job_id is not None:
        seqs = unfinished_seqs(job_id, url=url)
        click.echo(f"resuming job {job_id}: {len(seqs)} of {validation.n_items} items left; "
                   f"database {url}", err=True)
    else:
        job_id, n = _store(file, config, "embedded", name, url, "queued", validation)
        seqs = list(range(n))
        click.echo(f"job {job_id}: {n} items, method {config['method']}; database {url}",
                   err=True)
    click.echo("loading the engine...", err=True)
    t0 = time.perf_counter()
    try:
        with click.progressbar(length=len(seqs), label="generating", file=sys.stderr) as bar:
            run_items(job_id, seqs, url=url, on_item=lambda _k, _s: bar.update(1))
    except EngineLoadError as e:
        click.echo(f"\nerror: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: finished items of job {job_id} are kept in {url}; "
                   f"export them with `semjobs export {job_id} --db {url} -o OUT`", err=True)
        sys.exit(130)
    rep = export_job(job_id, output, errors, url=url, with_steps=steps)
    click.echo(f"done in {time.perf_counter() - t0:.1f}s", err=True)
    _print_export(rep)
    click.echo(job_id)

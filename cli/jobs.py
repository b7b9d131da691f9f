"""Job commands: submit, status, export, cancel, retry, and the embedded `run`.
Thin: parse, call `jobs`/`db`/`worker`, print."""

from __future__ import annotations

import json
import sys
import time

import click

from semjobs.jobs.export_fields import FORMATS, ONLY
from semjobs.jobs.schema import MAX_SAMPLES, MAX_SEED, name_problem

EXIT_INVALID_INPUT = 2
EXIT_SOME_FAILED = 3  # `run`: some items failed or were cancelled, the rest done
EXIT_NONE_DONE = 4  # `run`: not one item done


def force_option(f):
    return click.option("--force", is_flag=True,
                        help="Replace existing output files (a symlink is replaced, not written "
                        "through; the job's input file never).")(f)


def _storable_name(ctx, param, value: str | None) -> str | None:
    """--name as jobs.name can store it (refused before the file is read, not at the insert)."""
    problem = name_problem(value) if value is not None else None
    if problem:
        raise click.BadParameter(problem)
    return value


def generation_options(f):
    f = click.option("--stop-doomed/--keep-doomed", "stop_doomed", default=None,
                     help="Stop a sample the workers' doom rule says will not end right (finish reason `doomed`, "
                     "never kept; `semjobs doom calibrate` makes the rule, SEMJOBS_DOOM_RULE gives it; the step "
                     "methods apply a length rule only). Default: on where a rule is given (SEMJOBS_STOP_DOOMED).")(f)
    f = click.option("--stop-loops/--keep-loops", "stop_loops", default=None,
                     help="End a sample that starts repeating itself, its text cut where the loop began "
                     "(finish reason `repetition`; an answer written before it is kept and checked). "
                     "Default: on (SEMJOBS_STOP_LOOPS).")(f)
    f = click.option("--budget-tokens", type=click.IntRange(min=1), default=None,
                     help="Tokens the job may generate (kept, cut from loops, spent on samples aborted): once "
                     "spent, samples not started end `over_budget`. With --want or a budget, samples go out in "
                     "waves, so what is spent first covers every input once.")(f)
    f = click.option("--want", type=click.IntRange(1, MAX_SAMPLES), default=None,
                     help="Kept samples per input that are enough, of at most --n: once an input has this many "
                     "(right by its reference; without one, ended by itself with an answer), its other samples "
                     "are not decoded (state `unneeded`) and go out in waves (a line's own `want` wins).")(f)
    f = click.option("--n", "samples", type=click.IntRange(1, MAX_SAMPLES), default=1, show_default=True,
                     help="Samples per input, each an item of its own with its own seed "
                     "(a line's own `n`, or `n` in a Batch body, wins). Needs --temperature > 0.")(f)
    f = click.option("--name", default=None, callback=_storable_name,
                     help="Job name (default: the file name).")(f)
    f = click.option("--reproducible/--fastest", default=True, show_default=True,
                     help="Sampling: every request carries its sample's seed, so a rerun writes the same; "
                     "--fastest sends none (reruns differ; on a GPU vLLM keeps its fastest sampling "
                     "kernels, docs/gpu.md).")(f)
    f = click.option("--tau", type=click.FloatRange(0, 1), default=None,
                     help="semspec: reject a drafted step whose p_T (the target probe's estimate that the "
                     "target would say the same) is under this; 0 leaves the paper's rule alone. Default: "
                     "greedy, the floor the probes were calibrated with (p_T's scale is each calibration's), "
                     "none for probes trained without one; sampled, none (docs/benchmarks.md).")(f)
    f = click.option("--seed", type=click.IntRange(0, MAX_SEED), default=None, help="Sampling seed.")(f)
    f = click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None,
                     help="Nucleus sampling: draw from the smallest set of tokens holding this "
                     "much probability (default 1: all).")(f)
    f = click.option("--temperature", type=click.FloatRange(0, 2), default=None,
                     help="0 = greedy (default from SEMJOBS_TEMPERATURE).")(f)
    f = click.option("--max-new-tokens", type=click.IntRange(min=1), default=None,
                     help="Tokens to generate per item (default from SEMJOBS_MAX_NEW_TOKENS).")(f)
    f = click.option("--method", default=None,
                     help="ar | token_sd | step_judge | semspec (default from SEMJOBS_METHOD).")(f)
    return f


def assignments(ctx, param, values: tuple[str, ...]) -> dict:
    """KEY=VALUE options as a dict (a later KEY wins; VALUE JSON where it parses, else text):
    the callback of --engine-arg and probe collect's --chat-template-kwarg."""
    from semspec.engine.engine_args import EngineArgsError, parse_assignment

    try:
        return dict(parse_assignment(v) for v in values)
    except EngineArgsError as e:
        raise click.BadParameter(str(e)) from None


def engine_arg_options(f):
    """--engine-arg / --draft-engine-arg (`run`, `worker`, `bench`, `probe collect`): vLLM's own engine
    arguments per role, over the settings' (``use_engine_args``)."""
    f = click.option("--draft-engine-arg", "draft_engine_args", multiple=True, metavar="KEY=VALUE",
                     callback=assignments,
                     help="As --engine-arg, for the step methods' draft engine (over SEMJOBS_DRAFT_ENGINE_ARGS).")(f)
    f = click.option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE", callback=assignments,
                     help="A vLLM engine argument (EngineArgs name) for the target's engines, repeatable, "
                     "e.g. --engine-arg tensor_parallel_size=2 --engine-arg max_model_len=32768; VALUE is "
                     "JSON where it parses, else text (over SEMJOBS_TARGET_ENGINE_ARGS).")(f)
    return f


def use_engine_args(engine_args: dict, draft_engine_args: dict) -> None:
    """The command line's engine arguments over the settings', checked against vLLM (a bad
    one is a usage error, exit 2, before anything is stored or loaded) and put in the
    settings every engine process loads with."""
    from semjobs.settings import settings
    from semspec.engine.engine_args import EngineArgsError, check

    options = {"target": ("--engine-arg", engine_args), "draft": ("--draft-engine-arg", draft_engine_args)}
    problems, checked = [], True
    for role, (option, given) in options.items():
        setting = f"{role}_engine_args"
        for where, args in ((f"SEMJOBS_{setting.upper()}", getattr(settings, setting)), (option, given)):
            try:
                checked &= check(args, where) if args else True
            except EngineArgsError as e:
                problems.append(str(e))
    if problems:
        raise click.UsageError("\n".join(problems))
    if not checked:
        click.echo("warning: engine arguments not checked against vLLM's (vLLM is not installed here)", err=True)
    for role, (_, given) in options.items():
        setting = f"{role}_engine_args"
        setattr(settings, setting, {**getattr(settings, setting), **given})


def db_option(f):
    return click.option("--db", "db_url", default=None,
                        help="Database URL (default: SEMJOBS_DATABASE_URL when set, else the "
                        "database of the last `run` or `submit` here, else the embedded SQLite file).")(f)


def _config(method, max_new_tokens, temperature, top_p, seed, tau, samples, reproducible, stop_loops=None,
            want=None, stop_doomed=None) -> dict:
    from semjobs.jobs.submit import JobRuleError, check_job_rules, job_config

    try:
        config = job_config(method, max_new_tokens, temperature, seed, top_p, tau, stop_loops, stop_doomed)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--method") from None
    config["reproducible"] = reproducible
    try:
        check_job_rules(config, samples, want, seed_given=seed is not None)
    except JobRuleError as e:
        raise click.BadParameter(str(e), param_hint=f"--{e.option}") from None
    return config


def _storable(file, samples, validation=None, method=None, want=None, temperature=None):
    """FILE's validation; exits 2, saying why nothing was stored, when the job cannot be stored:
    a model path this machine lacks, models that cannot run ``method`` (when given: `run`
    asks its loaded engine instead), or any bad line."""
    from semjobs.jobs.submit import InvalidInput, method_problem, missing_model_files, validate

    problems = missing_model_files()
    if not problems and method is not None:
        problems = [p for p in [method_problem(method)] if p]
    for problem in problems:
        click.echo(f"error: {problem}; nothing was stored (SEMJOBS_CHECK_PROMPT_LENGTHS=0 skips "
                   "this check where only the workers have the files)", err=True)
        sys.exit(EXIT_INVALID_INPUT)
    if validation is None:
        validation = validate(file, samples, want, temperature)
    if validation.context_unchecked:
        click.echo(f"warning: prompt lengths not checked against the target's context "
                   f"({validation.context_unchecked})", err=True)
    if not validation.ok:
        e = InvalidInput(validation)
        for line in e.lines():
            click.echo(line, err=True)
        click.echo(f"error: {e}; nothing was stored", err=True)
        sys.exit(EXIT_INVALID_INPUT)
    return validation


def _database(db_url: str | None) -> str:
    """The database a command means (semjobs.jobs.locate.database_url)."""
    from semjobs.jobs.locate import PasswordNotStored, database_url

    try:
        return database_url(db_url)
    except PasswordNotStored as e:
        raise click.ClickException(str(e)) from None


def _locate(job: str | None, db_url: str | None) -> tuple[dict, str]:
    """(the job's status, its database): the job named, else the newest (semjobs.jobs.locate)."""
    from semjobs.jobs.locate import missing_sqlite_file, newest_job
    from semjobs.jobs.status import job_status

    url = _database(db_url)
    missing = missing_sqlite_file(url)
    if missing is not None:
        raise click.ClickException(f"no database at {missing}: give --db, or run a job first")
    job = job or newest_job(url)
    if job is None:
        raise click.ClickException(f"no job in {_shown(url)}; give --db or run a job first")
    st = job_status(job, url=url)
    if st is None:
        raise click.ClickException(f"no job {job!r} in {_shown(url)}")
    return st, url


def _shown(url: str) -> str:
    from semjobs.jobs.locate import shown_url

    return shown_url(url)


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@generation_options
def submit(file, method, max_new_tokens, temperature, top_p, seed, tau, reproducible, name, samples, want,
           budget_tokens, stop_loops, stop_doomed) -> None:
    """Validate FILE, store the job and its items, enqueue them; prints the job id last.

    Example: semjobs submit prompts.jsonl --method semspec --n 4 --temperature 0.6 --top-p 0.95"""
    from semjobs.jobs.locate import remember
    from semjobs.jobs.submit import enqueue_job, store_job
    from semjobs.settings import settings
    from semjobs.worker.queues import queue_name

    config = _config(method, max_new_tokens, temperature, top_p, seed, tau, samples, reproducible, stop_loops, want,
                     stop_doomed)
    queue = queue_name(kind=config["method"])  # the workers that serve the method take it
    t0 = time.perf_counter()
    validation = _storable(file, samples, method=config["method"], want=want, temperature=config["temperature"])
    job_id, n = store_job(file, config, queue=queue, name=name, status="pending", validation=validation,
                          samples=samples, want=want, budget_tokens=budget_tokens)
    from semjobs.worker.publish import publisher

    try:
        with publisher(queue) as send:
            tasks = enqueue_job(job_id, send)
    except Exception as e:  # broker down: the rows are stored, nothing is lost
        click.echo(f"error: job {job_id} stored but not enqueued ({type(e).__name__}: {e}); a running "
                   f"worker enqueues it once the broker answers (after SEMJOBS_PENDING_GRACE_S), or "
                   f"`semjobs retry --pending {job_id}` does", err=True)
        sys.exit(1)
    remember(job_id, settings.database_url)
    click.echo(f"submitted {n} items as {tasks} tasks to queue {queue} "
               f"in {time.perf_counter() - t0:.2f}s")
    click.echo(job_id)


@click.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Show a live progress bar until the job ends.")
@click.option("--interval", type=float, default=1.0, show_default=True)
@db_option
def status(job, as_json, watch, interval, db_url) -> None:
    """One job's progress (default: the newest job): counts, tokens/s, acceptance, answers.

    Example: semjobs status --watch"""
    from semjobs.db.models import JOB_ACTIVE
    from semjobs.jobs.status import job_status, progress_line, render

    st, url = _locate(job, db_url)
    if watch:
        tty = sys.stdout.isatty()
        while True:
            line = progress_line(st)
            # in a terminal: back to the line's start, the new line, clear what is left of the old
            click.echo(f"\r{line}\x1b[K" if tty else line, nl=not tty)
            if st["status"] not in JOB_ACTIVE:
                break
            time.sleep(interval)
            st = job_status(st["id"], url=url)
        if tty:
            click.echo()
    if as_json:
        click.echo(json.dumps(st, indent=2, default=str))
    else:
        click.echo(render(st))


@click.command("jobs")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--limit", type=int, default=20, show_default=True, help="How many jobs, newest first.")
@db_option
def jobs_command(as_json, limit, db_url) -> None:
    """Recent jobs: state, items, tokens/s, step acceptance, age.

    Example: semjobs jobs --limit 5"""
    from semjobs.jobs.status import fmt_duration, recent_jobs

    rows = recent_jobs(limit, url=_database(db_url))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'JOB':<14}{'STATUS':<11}{'DONE':>7}{'FAILED':>7}{'TOTAL':>7}{'TOK/S':>8}{'STEPS OK':>9}"
               f"{'AGE':>10}  {'METHOD':<10}NAME")
    for r in rows:
        c, acc = r["counts"], r["step_acceptance"]
        click.echo(f"{r['id']:<14}{r['status']:<11}{c['done']:>7}{c['failed']:>7}{r['n_items']:>7}"
                   f"{r['tokens_per_s'] or 0:>8.1f}{'-' if acc is None else f'{acc:.0%}':>9}"
                   f"{fmt_duration(r['age_s']):>10}  {r['method']:<10}{r['name'] or ''}")


@click.command()
@click.argument("job", required=False)
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Results: a file (jsonl, parquet, batch) or an empty directory (hf).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="jsonl (one row per sample), parquet, batch (the OpenAI Batch output shape, "
              "an input's samples as choices) or hf (a datasets directory with a dataset card). "
              "Default: parquet for a .parquet OUTPUT, batch for jobs of Batch lines, else jsonl.")
@click.option("--only", type=click.Choice(ONLY), default=None,
              help="Keep only the samples whose final answer is right (or wrong) by the input's reference, "
              "or those a dataset keeps (kept: right; without a reference, ended with an answer).")
@click.option("--majority", is_flag=True,
              help="Keep one sample per input: the first giving its most frequent answer.")
@click.option("--errors", type=click.Path(dir_okay=False), default=None,
              help="Failed/cancelled items (default: OUTPUT's name + .errors.jsonl, "
              "written only when there are any).")
@click.option("--steps", is_flag=True, help="Include the per-step log in each line.")
@force_option
@db_option
def export(job, output, fmt, only, majority, errors, steps, force, db_url) -> None:
    """Write one row per finished sample, keyed by the input's id and the sample.

    JOB defaults to the newest job. Example (rejection sampling):
    semjobs export --only correct --format hf -o data/correct"""
    st, url = _locate(job, db_url)
    _export(st["id"], output, errors, url, steps, force, fmt=fmt, only=only, majority=majority)


def _export(job_id, output, errors, url, steps, force, **filters) -> None:
    from semjobs.jobs.export import export_job

    try:
        rep = export_job(job_id, output, errors, url=url, with_steps=steps, force=force, **filters)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
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
@click.argument("job", required=False)
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for report.md, the PNGs and manifest.json.")
@force_option
@db_option
def report(job, out_dir, force, db_url) -> None:
    """A job's report (default: the newest job): PNGs of step acceptance by position, of step
    lengths and of throughput over time, its figures as Markdown, and its manifest.

    Example: semjobs report -o out/report"""
    from semjobs.jobs.report import REPORT_FILES, write_report

    st, url = _locate(job, db_url)
    try:
        out = write_report(st["id"], out_dir, url=url, force=force)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"report of job {st['id']} in {out}: {', '.join(REPORT_FILES)}")


@click.command()
@click.argument("job_a")
@click.argument("others", metavar="JOB_B [JOB_C ...]", nargs=-1, required=True)
@click.option("--no-loglik", is_flag=True, help="Skip the target's log-likelihood of the outputs.")
@db_option
def compare(job_a, others, no_loglik, db_url) -> None:
    """Each job against JOB_A, all run on the same input: tokens/s, the share of drafted steps
    kept, and the target's log-likelihood of each job's outputs (the gap: how much less the
    target likes that job's text), one line per job.

    Example: semjobs compare AR_JOB TOKEN_SD_JOB SEMSPEC_JOB"""
    from semjobs.jobs.compare import NotComparable, compare_jobs

    _, url = _locate(job_a, db_url)
    for other in others:
        try:
            click.echo(compare_jobs(job_a, other, url=url, loglik=not no_loglik).line())
        except NotComparable as e:
            raise click.ClickException(str(e)) from e


@click.command()
@click.argument("job")
@db_option
def cancel(job, db_url) -> None:
    """Cancel a job: pending items are dropped, running items are stopped within seconds.

    Example: semjobs cancel 3f2a9c1b7d4e"""
    from semjobs.db import repo
    from semjobs.db.models import JOB_ACTIVE
    from semjobs.db.session import session_factory

    st, db_url = _locate(job, db_url)
    if st["status"] not in JOB_ACTIVE:
        click.echo(f"job {job} is already {st['status']}: nothing was cancelled")
        return
    with session_factory(db_url)() as session:
        n = repo.cancel_job(session, job)
    click.echo(f"job {job} cancelled; {n} pending items will not run, running ones stop within seconds")


@click.command()
@click.argument("job")
@click.option("--pending", "include_pending", is_flag=True,
              help="Also re-enqueue pending items (e.g. after the broker lost its queue).")
@db_option
def retry(job, include_pending, db_url) -> None:
    """Re-enqueue the job's failed items (only those). A cancelled job is refused (exit 1):
    its cancel stands; submit its input again to run it.

    Example: semjobs retry 3f2a9c1b7d4e --pending"""
    from semjobs.db import repo
    from semjobs.db.session import session_factory
    from semjobs.jobs.submit import enqueue_job
    from semjobs.worker.publish import publisher

    st, db_url = _locate(job, db_url)
    with session_factory(db_url)() as session:
        try:
            seqs = repo.reset_failed(session, job)
        except repo.JobCancelled as e:
            raise click.ClickException(f"{e}: nothing to retry (submit its input again to run it)") from None
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
@force_option
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue an unfinished job of the same file and settings in this "
              "database (after a crash or Ctrl-C) instead of starting a new one.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Items each engine process decodes at once (default: SEMJOBS_BATCH_SIZE).")
@click.option("--processes", type=click.IntRange(min=1), default=None,
              help="Engine processes (default: SEMJOBS_PROCESSES, else one per core on a CPU, at "
              "least 8 items each, one on a GPU).")
@engine_arg_options
def run(file, output, errors, method, max_new_tokens, temperature, top_p, seed, tau, reproducible, name, samples, want,
        budget_tokens, stop_loops, stop_doomed, db_url, steps, force, resume, batch_size, processes, engine_args, draft_engine_args) -> None:
    """Embedded mode: no servers; process FILE on this machine into a SQLite file, then
    export. Same tables, same per-item code as the workers; on a CPU one engine process per
    core.

    Exit status: 0 every item done (but those --want or --budget-tokens left undecoded), 3 some
    failed or cancelled, 4 none done, 2 bad input (nothing stored), 130 interrupted, 1 any other
    error.

    Example: semjobs run examples/prompts.jsonl -o out/results.jsonl --batch-size 16
    --engine-arg max_model_len=4096"""
    from semjobs.db import migrate
    from semjobs.jobs.export import check_targets
    from semjobs.jobs.locate import missing_sqlite_file, remember
    from semjobs.jobs.status import answers_line, job_status, kept_line
    from semjobs.jobs.submit import find_resumable, store_job, unfinished_seqs, validate, work_order
    from semjobs.settings import settings
    from semjobs.worker import engine_processes
    from semjobs.worker.engine import EngineLoadError
    from semjobs.worker.queues import EMBEDDED_QUEUE
    from semjobs.worker.process import engine_request

    url = db_url or settings.embedded_database_url
    if batch_size is not None:
        settings.batch_size = batch_size
    if processes is not None:
        settings.processes = processes
    use_engine_args(engine_args, draft_engine_args)
    config = _config(method, max_new_tokens, temperature, top_p, seed, tau, samples, reproducible, stop_loops, want,
                     stop_doomed)
    try:  # before any work: an output that would be refused is refused now, not after the run
        check_targets(output, errors, force=force, input_path=file, url=url)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    validation = validate(file, samples, want, config["temperature"])
    # A refused run leaves the database as it was: one without a schema (a new SQLite file
    # too) is created only once the job is accepted, just before it is stored.
    fresh = missing_sqlite_file(url) is not None or migrate.current(url) is None
    if not fresh:
        migrate.upgrade(url)  # the job to resume is looked up in the current schema
    job_id = (find_resumable(validation, config, samples=samples, want=want, budget_tokens=budget_tokens, url=url)
              if resume and validation.ok and not fresh else None)
    seqs = unfinished_seqs(job_id, url=url) if job_id is not None else None
    n_procs, threads = (engine_processes.plan(len(seqs) if seqs is not None else validation.n_samples)
                        if validation.ok else (1, settings.threads))
    with engine_processes.open_engines(n_procs, threads, engine_request(config)) as engines:
        if validation.ok:  # load first: a model or probe file that cannot load stores no job
            # (bad input is refused by _storable below, before anything loads)
            click.echo("loading the engine" + (f" in {n_procs} processes, {threads} torch thread(s) "
                       "each" if n_procs > 1 else "") + "...", err=True)
            try:
                problem = engines.wait_loaded().get(config["method"])
            except EngineLoadError as e:
                problem = str(e)
            if problem is not None:
                click.echo(f"error: {problem}; nothing was stored", err=True)
                sys.exit(1)
        if job_id is not None:
            click.echo(f"resuming job {job_id}: {len(seqs)} of {validation.n_samples} items left; "
                       f"database {_shown(url)}", err=True)
        else:
            _storable(file, samples, validation)
            if fresh:
                migrate.upgrade(url)
            job_id, n = store_job(file, config, queue=EMBEDDED_QUEUE, name=name, url=url, status="queued",
                                  validation=validation, samples=samples, want=want, budget_tokens=budget_tokens)
            remember(job_id, url)
            seqs = list(range(n))
            click.echo(f"job {job_id}: {n} items, method {config['method']}; database {_shown(url)}",
                       err=True)
        seqs, in_waves = work_order(job_id, seqs, url)
        t0 = time.perf_counter()
        try:
            with click.progressbar(length=len(seqs), label="generating", file=sys.stderr) as bar:
                # in waves an input's samples are far apart: one at a time
                engines.run(job_id, seqs, url, on_item=lambda _seq: bar.update(1), block=1 if in_waves else samples)
        except KeyboardInterrupt:
            click.echo(f"\ninterrupted: finished items of job {job_id} are kept in {_shown(url)}; "
                       f"export them with `semjobs export {job_id} --db {_shown(url)} -o OUT`", err=True)
            sys.exit(130)
        except engine_processes.EngineProcessLost as e:
            click.echo(f"\nerror: {e}; finished items of job {job_id} are kept in {_shown(url)}; "
                       "run the same command again to finish the rest", err=True)
            sys.exit(1)
    click.echo(f"done in {time.perf_counter() - t0:.1f}s", err=True)
    _export(job_id, output, errors, url, steps, force)
    st = job_status(job_id, url=url)
    if st["answers"]:
        click.echo(f"answers: {answers_line(st['answers'])}", err=True)
    click.echo(f"kept: {kept_line(st['yield'])}", err=True)
    click.echo(job_id)
    # the samples an input no longer needed (--want) were not to be done
    sys.exit(_run_exit_code(st["counts"]["done"], st["n_items"] - st["counts"]["unneeded"]
                            - st["counts"]["over_budget"]))


def _run_exit_code(done: int, items: int) -> int:
    """`run`'s exit status, so a script that chains it learns whether it may go on."""
    if done == items:
        return 0
    return EXIT_NONE_DONE if done == 0 else EXIT_SOME_FAILED

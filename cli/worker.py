"""`semjobs worker`: a Celery worker configured by the settings object."""

import json
import os
import sys

import click

from semjobs.cli.jobs import engine_arg_options
from semspec.types import METHODS


@click.command()
@click.option("-Q", "--queue", "queues", multiple=True,
              help="Queue(s) to consume (default: this model pair's queues of the methods it serves).")
@click.option("--method", "methods", multiple=True, type=click.Choice(METHODS),
              help="A method this worker decodes, repeatable: it takes only their jobs and keeps its "
              "GPU's memory for their engines (default: SEMJOBS_METHODS, else every method).")
@click.option("-c", "--concurrency", default=1, show_default=True,
              help="Celery pool processes of one worker node (> 1: prefork, one chunk each).")
@click.option("--pool", type=click.Choice(["auto", "solo", "prefork", "threads"]), default="auto",
              show_default=True, help="auto: solo for one process, prefork (lazy model load "
              "in each child) for more.")
@click.option("-n", "--hostname", default=None,
              help="Celery node name (default: semjobs-PID@HOST, unique per process).")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.option("--max-tasks-per-child", type=int, default=None)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch CPU threads per worker process (default: SEMJOBS_THREADS, else one "
              "on a CPU, torch's choice on a GPU or with -c > 1).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Items each process decodes at once (default: SEMJOBS_BATCH_SIZE).")
@click.option("--processes", type=click.IntRange(min=1), default=None,
              help="Worker processes, each a Celery node with its own engine (default: "
              "SEMJOBS_PROCESSES, else one per core on a CPU, one on a GPU).")
@engine_arg_options
def worker(queues, methods, concurrency, pool, hostname, loglevel, max_tasks_per_child, threads,
           batch_size, processes, engine_args, draft_engine_args) -> None:
    """Start a Celery worker (late acks, prefetch 1, task events on).

    One process (on a GPU) uses the "threads" pool: one thread per chunk the process holds,
    enough chunks to keep a batch of --batch-size items full, all decoded by the process's
    one engine. On a CPU one such worker runs per core, with one torch thread each, under a
    supervisor that restarts any that dies. With -c N > 1, N prefork processes each decode
    one chunk at a time (a batch of at most SEMJOBS_CHUNK_SIZE items).

    Example: semjobs worker --batch-size 16 --threads 2
    (a worker of semspec jobs only: --method semspec)
    (on a GPU pair: --engine-arg tensor_parallel_size=2 --engine-arg max_model_len=32768)
    """
    from semjobs.cli.jobs import use_engine_args
    from semjobs.settings import settings
    from semjobs.worker.celery import app
    from semjobs.worker.engine_processes import plan
    from semjobs.worker.queues import worker_queues

    if settings.vllm_compile is None:  # a worker decodes for hours: compiled graphs pay for their start
        settings.vllm_compile = True
    if threads is not None:
        # Applied where the engine loads (semjobs.worker.engine.set_threads); prefork children
        # inherit the settings object when they fork.
        settings.threads = threads
    if batch_size is not None:
        settings.batch_size = batch_size
    if processes is not None:
        settings.processes = processes
    if methods:
        if settings.queue:
            raise click.UsageError("--method cannot go with SEMJOBS_QUEUE: its one queue carries every method's jobs")
        settings.methods = list(methods)
    use_engine_args(engine_args, draft_engine_args)  # before Celery starts: exit 2 on a bad one
    if concurrency == 1 and pool in ("auto", "threads"):
        n, settings.threads = plan()
        if n > 1:
            sys.exit(_supervise(n, settings.threads, queues, hostname, loglevel, max_tasks_per_child))

    if pool == "auto":
        pool = "threads" if concurrency == 1 else "prefork"
    if pool == "threads" and concurrency == 1:
        concurrency = chunks_to_fill(settings.batch_size, settings.chunk_size)
    argv = [
        "worker", "-Q", ",".join(queues or worker_queues()), "--concurrency", str(concurrency),
        "--pool", pool, "--loglevel", loglevel, "-E",
    ]
    # Celery's default, celery@HOST, would name a killed worker and its replacement alike
    # (in Flower, in the heartbeats): the process id tells them apart.
    argv += ["--hostname", hostname or f"semjobs-{os.getpid()}@%h"]
    if max_tasks_per_child:
        argv += ["--max-tasks-per-child", str(max_tasks_per_child)]
    app.worker_main(argv)


def _supervise(n, threads, queues, hostname, loglevel, max_tasks_per_child) -> int:
    """Run ``n`` one-process workers of these options under semjobs.worker.supervisor; its exit code."""
    from semjobs.settings import settings
    from semjobs.worker.supervisor import Supervisor

    name, _, host = (hostname or f"semjobs-{os.getpid()}@%h").partition("@")
    common = [sys.executable, "-m", "semjobs.cli", "worker", "--processes", "1", "--threads", str(threads),
              "--batch-size", str(settings.batch_size), "-l", loglevel]
    for q in queues:
        common += ["-Q", q]
    for m in settings.methods or ():
        common += ["--method", m]
    # the engine arguments as checked here (the settings' and the command line's): a child's
    # own settings would read the environment's alone
    for option, args in (("--engine-arg", settings.target_engine_args),
                         ("--draft-engine-arg", settings.draft_engine_args)):
        common += [word for key, value in args.items() for word in (option, f"{key}={json.dumps(value)}")]
    if max_tasks_per_child:
        common += ["--max-tasks-per-child", str(max_tasks_per_child)]
    click.echo(f"semjobs worker: {n} processes, {threads} torch thread(s) each", err=True)
    return Supervisor([[*common, "-n", f"{name}-{i}@{host or '%h'}"] for i in range(n)]).run()


def chunks_to_fill(batch_size: int, chunk_size: int) -> int:
    """Chunks one process must hold so its batch stays full: enough to fill it, plus one
    whose items wait to take the slots that free as the others near their end."""
    return -(-batch_size // chunk_size) + 1

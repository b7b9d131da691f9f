"""`semjobs worker`: a Celery worker configured by the settings object."""

import os

import click


@click.command()
@click.option("-Q", "--queue", "queues", multiple=True,
              help="Queue(s) to consume (default: this model pair's queue).")
@click.option("-c", "--concurrency", default=1, show_default=True,
              help="Worker processes; one per GPU.")
@click.option("--pool", type=click.Choice(["auto", "solo", "prefork", "threads"]), default="auto",
              show_default=True, help="auto: solo for one process, prefork (lazy model load "
              "in each child) for more.")
@click.option("-n", "--hostname", default=None,
              help="Celery node name (default: semjobs-PID@HOST, unique per process).")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.option("--max-tasks-per-child", type=int, default=None)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch CPU threads per worker process (default: SEMJOBS_THREADS, else "
              "torch's choice).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Items each process decodes at once (default: SEMJOBS_BATCH_SIZE).")
def worker(queues, concurrency, pool, hostname, loglevel, max_tasks_per_child, threads,
           batch_size) -> None:
    """Start a Celery worker (late acks, prefetch 1, task events on).

    With one process (the default) the pool is "threads": one thread per chunk the process
    holds, enough chunks to keep a batch of --batch-size items full, all decoded by the
    process's one engine. With -c N > 1, N prefork processes each decode one chunk at a
    time (a batch of at most SEMJOBS_CHUNK_SIZE items).

    Example: semjobs worker --batch-size 16 --threads 2
    """
    from semjobs.settings import settings
    from worker.celery import app
    from worker.queues import queue_name

    if threads is not None:
        # Applied where the engine loads (worker.engine.set_threads); prefork children
        # inherit the settings object when they fork.
        settings.threads = threads
    if batch_size is not None:
        settings.batch_size = batch_size

    if pool == "auto":
        pool = "threads" if concurrency == 1 else "prefork"
    if pool == "threads" and concurrency == 1:
        concurrency = chunks_to_fill(settings.batch_size, settings.chunk_size)
    argv = [
        "worker", "-Q", ",".join(queues or [queue_name()]), "--concurrency", str(concurrency),
        "--pool", pool, "--loglevel", loglevel, "-E",
    ]
    # Celery's default, celery@HOST, would name a killed worker and its replacement alike
    # (in Flower, in the heartbeats): the process id tells them apart.
    argv += ["--hostname", hostname or f"semjobs-{os.getpid()}@%h"]
    if max_tasks_per_child:
        argv += ["--max-tasks-per-child", str(max_tasks_per_child)]
    app.worker_main(argv)


def chunks_to_fill(batch_size: int, chunk_size: int) -> int:
    """Chunks one process must hold so its batch stays full: enough to fill it, plus one
    whose items wait to take the slots that free as the others near their end."""
    return -(-batch_size // chunk_size) + 1

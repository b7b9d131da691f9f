"""`semjobs recover`: one reaper pass by hand (every worker also runs it on each heartbeat)."""

import click


@click.command()
@click.option("--db", "db_url", default=None,
              help="Database URL (default: SEMJOBS_DATABASE_URL).")
def recover(db_url) -> None:
    """Re-enqueue the items of workers silent for SEMJOBS_WORKER_DEAD_AFTER_S (killed or
    preempted), without waiting for the broker's visibility timeout.

    Example: semjobs recover"""
    from semjobs.settings import settings
    from semjobs.worker.recovery import recover as run_recover

    released = run_recover(db_url)
    if not released.workers:
        click.echo(f"no worker silent for {settings.worker_dead_after_s:g}s")
        return
    click.echo(f"dead workers: {', '.join(released.workers)}")
    for job_id, seqs in released.items.items():
        click.echo(f"job {job_id}: re-enqueued {len(seqs)} items")
    if not released.items:
        click.echo("they held no items")

"""The `semjobs` command: a Click group; each command family lives in its own module.

Command modules import their heavy dependencies (Celery, SQLAlchemy, torch) inside the
commands, so `semjobs --help` stays fast.
"""

import atexit
import os
import sys
import threading

import click


class _Main(click.Group):
    """Turns the common set-up mistakes into one-line errors instead of tracebacks."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Exception as e:  # noqa: BLE001
            name = type(e).__name__
            if name == "OperationalError" and "sqlalchemy" in type(e).__module__:
                raise click.ClickException(
                    f"cannot use the database: {str(e.orig).strip().splitlines()[0]} "
                    "(check SEMJOBS_DATABASE_URL / --db)") from e
            if name == "ProgrammingError" and "does not exist" in str(e):
                raise click.ClickException(
                    "the database has no semjobs schema yet: run `semjobs db upgrade`") from e
            if name == "ValidationError" and type(e).__module__.startswith("pydantic"):
                raise click.ClickException(_bad_setting(e.errors()[0])) from e
            if isinstance(e, OSError) and e.strerror:  # a path that cannot be read or written
                where = f"{e.filename}: " if e.filename else ""
                raise click.ClickException(f"{where}{e.strerror}") from e
            raise


def _bad_setting(error: dict) -> str:
    """A settings error (an environment variable or a SEMJOBS_ENV_FILE line) as one sentence."""
    if not error["loc"]:  # a rule across settings
        return f"bad settings: {error['msg'].removeprefix('Value error, ')}"
    key = f"SEMJOBS_{str(error['loc'][0]).upper()}"
    return f"bad setting {key}={error['input']!r}: {error['msg'][0].lower()}{error['msg'][1:]}"


@click.group(cls=_Main)
def main() -> None:
    """Bulk chain-of-thought generation with SemanticSpec decoding."""


from semjobs.cli.db import db  # noqa: E402
from semjobs.cli.jobs import cancel, compare, export, jobs_command, report, retry, run, status, submit  # noqa: E402
from semjobs.cli.recover import recover  # noqa: E402
from semjobs.cli.worker import worker  # noqa: E402

for _command in (submit, jobs_command, status, compare, export, report, cancel, retry, worker, recover, db, run):
    main.add_command(_command)

# Other command families (engine tooling) register below, one line each:
main.add_command(__import__("semjobs.cli.draft", fromlist=["draft"]).draft)  # semjobs draft ...
main.add_command(__import__("semjobs.cli.probe", fromlist=["probe"]).probe)  # semjobs probe ...
main.add_command(__import__("semjobs.cli.bench", fromlist=["bench"]).bench)  # semjobs bench ...
main.add_command(__import__("semjobs.cli.doom", fromlist=["doom"]).doom)  # semjobs doom ...


def run() -> None:
    """The `semjobs` program (its console script, `python -m semjobs.cli`): ``main``, then,
    where vLLM was loaded, an exit without the interpreter's teardown (``leave``)."""
    try:
        main(prog_name="semjobs")
    except SystemExit as e:
        if "vllm" in sys.modules and (e.code is None or isinstance(e.code, int)):
            leave(e.code or 0)
        raise


def leave(code: int) -> None:
    """End the process with ``code`` as the interpreter would, but for its teardown: other
    threads are waited for and the exit handlers run (vLLM's engine shutdown, multiprocessing's
    children, logging's flush, the answer checker's helper), then the process ends without
    collecting its heap, which with vLLM loaded took 2-3 s at the end of every command and
    every worker's stop (an idle worker on a tiny model stopped in 4.2 s, now in 1.4-1.8 s)."""
    threading._shutdown()  # (what the interpreter itself calls first on exit)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be written
            pass
    os._exit(code)

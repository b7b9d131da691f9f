"""The `semjobs` command: a Click group; each command family lives in its own module.

Command modules import their heavy dependencies (Celery, SQLAlchemy, torch) inside the
commands, so `semjobs --help` stays fast.
"""

import click


@click.group()
def main() -> None:
    """Bulk chain-of-thought generation with SemanticSpec decoding."""


from cli.db import db  # noqa: E402
from cli.jobs import cancel, export, retry, run, status, submit  # noqa: E402
from cli.worker import worker  # noqa: E402

for _command in (submit, status, export, cancel, retry, worker, db, run):
    main.add_command(_command)

# Other command families (engine tooling) register below, one line each:
main.add_command(__import__("cli.draft", fromlist=["draft"]).draft)  # semjobs draft ...
main.add_command(__import__("cli.probe", fromlist=["probe"]).probe)  # semjobs probe ...

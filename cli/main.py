"""The `semjobs` command: a Click group; each command family lives in its own module."""

import click


@click.group()
def main() -> None:
    """Bulk chain-of-thought generation with SemanticSpec decoding."""

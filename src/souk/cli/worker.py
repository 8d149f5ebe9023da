"""`souk worker`: run one worker daemon."""

from __future__ import annotations

import typer


def run(name: str = typer.Option(..., help="This worker's id, unique in the fleet.")) -> None:
    """Run a worker daemon: the source of truth for every machine on this host."""
    raise typer.Exit(0)

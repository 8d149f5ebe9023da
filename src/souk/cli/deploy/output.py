"""What the deploy commands print: a deploy's outcome or failure, machines as rows, as a Rich
table for a person or as JSON (--json) for a program."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NoReturn

import typer

from souk.cli.command import cell, console
from souk.cli.command import table as command_table
from souk.cli.deploy.errors import DeployError, MachineFailed
from souk.cli.deploy.plan import MachineView
from souk.cli.deploy.progress import Progress

COLUMNS = ["region", "id", "role", "release", "state", "health", "worker"]


@dataclass
class Outcome:
    app: str
    release: int
    strategy: str
    plan: dict[str, Any]
    machines: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "app": self.app,
            "release": self.release,
            "strategy": self.strategy,
            "plan": self.plan,
            "machines": self.machines,
        }


def machine_row(m: MachineView) -> dict[str, Any]:
    return {
        "id": m.id,
        "region": m.region,
        "worker": m.worker,
        "state": m.state,
        "role": m.role or "",
        "release": m.release,
        "health": m.health(),
        "hidden": m.hidden,
        "standby_for": m.standby_for,
    }


def describe(exc: DeployError) -> dict[str, Any]:
    return {"ok": False, "error": exc.message, **json.loads(json.dumps(exc.details, default=str))}


def report(outcome: Outcome | DeployError, progress: Progress, as_json: bool) -> None:
    """A deploy's end: its machines, or why it failed (then exit 1)."""
    if isinstance(outcome, DeployError):
        _failed(outcome, progress, as_json)
    if as_json:
        print(json.dumps({**outcome.to_json(), "events": progress.events}, indent=2))
        return
    table(outcome.machines, f"{outcome.app}: release {outcome.release}")


def table(rows: list[dict[str, Any]], title: str) -> None:
    cells = []
    for row in rows:
        role = row["role"] + (" (hidden)" if row.get("hidden") else "")
        cells.append([cell(row.get(c)) if c != "role" else role for c in COLUMNS])
    console().print(command_table(COLUMNS, cells, title))


def _failed(exc: DeployError, progress: Progress, as_json: bool) -> NoReturn:
    if as_json:
        print(json.dumps({**describe(exc), "events": progress.events}, indent=2))
        raise typer.Exit(1)
    err = console(stderr=True)
    err.print(f"[bold red]deploy failed:[/bold red] {exc.message}")
    if isinstance(exc, MachineFailed):
        logs = exc.details.get("logs", {})
        for stream in ("stdout", "stderr"):
            if logs.get(stream):
                err.print(f"[dim]--- last lines of {exc.details['machine']} {stream} ---[/dim]")
                for line in logs[stream]:
                    err.print(line, markup=False)
    raise typer.Exit(1)

"""How every command ends: its coroutine run, a refusal turned into a message and an exit
status (as JSON with --json), its rows printed as a table or as JSON."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from souk.clients.machines import MachinesApiError

T = TypeVar("T")


class CommandError(Exception):
    """The command cannot go on; its message is for the user, `code` its exit status."""

    code = 1


def run(coro: Coroutine[Any, Any, T], as_json: bool = False) -> T:
    """Run a command's coroutine; refusals and API errors become a message and an exit."""
    try:
        return asyncio.run(coro)
    except CommandError as exc:
        fail(str(exc), as_json, exc.code)
    except MachinesApiError as exc:
        fail(f"error {exc}", as_json)
    except KeyboardInterrupt:  # what was held (a deploy's leases) was let go on the way out
        fail("interrupted", as_json, code=130)


def fail(message: str, as_json: bool, code: int = 1) -> NoReturn:
    if as_json:
        print(json.dumps({"ok": False, "error": message}, indent=2))
    else:
        typer.echo(message, err=True)
    raise typer.Exit(code)


def problems(exc: ValidationError) -> str:
    """Every problem of an input, one a line, each starting with its field."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field"
        lines.append(f"{where}: {message}" if where else message)
    return "\n".join(lines)


# A console that is not a terminal (a pipe, a file) gets lines as long as they are: ids are
# copied from output, and one cut at 80 columns ("5774775…") cannot be.
PIPED_WIDTH = 100_000


def console(stderr: bool = False) -> Console:
    """Rich's console for the CLI's output: a terminal's width, else no width at all."""
    found = Console(stderr=stderr, highlight=False)
    if not found.is_terminal:
        found = Console(stderr=stderr, highlight=False, width=PIPED_WIDTH)
    return found


def cell(value: Any) -> str:
    """How a value shows in a table: nothing for None (never "None")."""
    return "" if value is None else str(value)


def is_key(column: str) -> bool:
    """Columns of ids and names, which a narrow terminal must not cut: they are copied."""
    return column in ("id", "name", "machine", "worker", "volume") or column.endswith("_id")


def table(columns: list[str], rows: list[list[str]], title: str = "") -> Table:
    """A table whose ids are never cut: each id column is as wide as its widest cell, and the
    other columns fold their text rather than end it with an ellipsis."""
    out = Table(title=title or None)
    for i, column in enumerate(columns):
        if is_key(column):
            widest = max((len(row[i]) for row in rows), default=0)
            out.add_column(column, no_wrap=True, min_width=max(widest, len(column)))
        else:
            out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*row)
    return out


def show(rows: list[dict[str, Any]], columns: list[str], as_json: bool, title: str = "") -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    console().print(table(columns, cells, title))

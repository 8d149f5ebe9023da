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


def show(rows: list[dict[str, Any]], columns: list[str], as_json: bool, title: str = "") -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(*columns, title=title or None)
    for row in rows:
        table.add_row(*(str(row.get(c, "")) for c in columns))
    Console().print(table)

"""`souk secrets`: set, list and unset an app's secrets. Values go in and never come out: a
list shows names and digests. Machines get the secrets in their environment when they are next
created or updated, which `souk deploy` does."""

from __future__ import annotations

import sys

import typer

from souk.cli.client import AppOption, Broker, JsonOption, broker
from souk.cli.command import show
from souk.cli.options import grouped
from souk.models.secrets import AppSecret

app = typer.Typer(help="An app's secrets: set, list, unset.", no_args_is_help=True)

COLUMNS = ["name", "digest", "updated_at"]
ROLL_OUT = "machines get them at their next update: run `souk deploy`"


def parse_pairs(pairs: list[str], stdin: str | None = None) -> dict[str, str]:
    """NAME=VALUE arguments; one `NAME=-` takes its value from standard input (kept out of the
    shell's history and the process list), without its final newline."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{name[:64]!r}: NAME=VALUE, or NAME=- for stdin")
        values[name] = value
    from_stdin = [name for name, value in values.items() if value == "-"]
    if len(from_stdin) > 1:
        raise typer.BadParameter("only one NAME=- may read standard input")
    for name in from_stdin:
        values[name] = (sys.stdin.read() if stdin is None else stdin).removesuffix("\n")
    return values


def _rows(secrets: list[AppSecret]) -> list[dict[str, str]]:
    return [s.model_dump() for s in secrets]


def _changed(broker: Broker, app: str, values: dict[str, str | None], as_json: bool) -> None:
    """The app's secrets changed to `values` (None: removed), in one step, and shown."""
    answer = broker.call(lambda client: client.update_secrets(app, values), as_json)
    show(_rows(answer.secrets), COLUMNS, as_json, title=f"secrets of {app}")
    if not as_json:
        typer.echo(f"secrets version {answer.version}; {ROLL_OUT}", err=True)


@app.command("set")
@grouped(broker=broker)
def set_(
    pairs: list[str] = typer.Argument(..., help="NAME=VALUE (NAME=- reads the value from stdin)."),
    *,
    app_name: AppOption,
    broker: Broker,
    as_json: JsonOption = False,
) -> None:
    """Set secrets, all in one step: `souk secrets set -a web DB_URL=postgres://...`."""
    _changed(broker, app_name, dict(parse_pairs(pairs)), as_json)


@app.command("unset")
@grouped(broker=broker)
def unset(
    names: list[str] = typer.Argument(..., help="Names of the secrets to remove."),
    *,
    app_name: AppOption,
    broker: Broker,
    as_json: JsonOption = False,
) -> None:
    """Remove secrets, all in one step."""
    _changed(broker, app_name, dict.fromkeys(names), as_json)


@app.command("list")
@grouped(broker=broker)
def list_(*, app_name: AppOption, broker: Broker, as_json: JsonOption = False) -> None:
    """The app's secrets: names and digests (a digest changes when the value does)."""
    found = broker.call(lambda client: client.secrets(app_name), as_json)
    show(_rows(found.secrets), COLUMNS, as_json, title=f"secrets of {app_name}")

"""`souk secrets`: set, list and unset an app's secrets. Values go in and never come out: a
list shows names and digests. Machines get the secrets in their environment when they are next
created or updated, which `souk deploy` does."""

from __future__ import annotations

import sys

import typer

from souk.cli.client import AppOption, Broker, JsonOption, OnApp, broker
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


@grouped(broker=broker)
def _app_secrets(app_name: AppOption, *, broker: Broker, as_json: JsonOption = False) -> OnApp:
    """`--app` (required: secrets are never the default app's by accident), `--api`,
    `--token` and `--json`."""
    return OnApp(app_name, broker, as_json)


def _changed(on: OnApp, values: dict[str, str | None]) -> None:
    """The app's secrets changed to `values` (None: removed), in one step, and shown."""
    answer = on.call(lambda client: client.update_secrets(on.app, values))
    show(_rows(answer.secrets), COLUMNS, on.as_json, title=f"secrets of {on.app}")
    if not on.as_json:
        typer.echo(f"secrets version {answer.version}; {ROLL_OUT}", err=True)


@app.command("set")
@grouped(on=_app_secrets)
def set_(
    pairs: list[str] = typer.Argument(..., help="NAME=VALUE (NAME=- reads the value from stdin)."),
    *,
    on: OnApp,
) -> None:
    """Set secrets, all in one step: `souk secrets set -a web DB_URL=postgres://...`."""
    _changed(on, dict(parse_pairs(pairs)))


@app.command("unset")
@grouped(on=_app_secrets)
def unset(
    names: list[str] = typer.Argument(..., help="Names of the secrets to remove."), *, on: OnApp
) -> None:
    """Remove secrets, all in one step."""
    _changed(on, dict.fromkeys(names))


@app.command("list")
@grouped(on=_app_secrets)
def list_(*, on: OnApp) -> None:
    """The app's secrets: names and digests (a digest changes when the value does)."""
    found = on.call(lambda client: client.secrets(on.app))
    show(_rows(found.secrets), COLUMNS, on.as_json, title=f"secrets of {on.app}")

"""`souk secrets`: set, list and unset an app's secrets. Values go in and never come out: a
list shows names and digests. Machines get the secrets in their environment when they are next
created or updated, which `souk deploy` does."""

from __future__ import annotations

import sys

import typer

from souk.cli.client import API, TOKEN, connect
from souk.cli.command import run, show
from souk.models.secrets import AppSecret, AppSecretsUpdateResp

app = typer.Typer(help="An app's secrets: set, list, unset.", no_args_is_help=True)

APP = typer.Option(..., "--app", "-a", help="The app.")
JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")
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


def _update(
    api: str | None, token: str | None, app: str, values: dict[str, str | None]
) -> AppSecretsUpdateResp:
    async def go() -> AppSecretsUpdateResp:
        async with connect(api, token) as client:
            return await client.update_secrets(app, values)

    return run(go())


@app.command("set")
def set_(
    pairs: list[str] = typer.Argument(..., help="NAME=VALUE (NAME=- reads the value from stdin)."),
    app_name: str = APP,
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """Set secrets, all in one step: `souk secrets set -a web DB_URL=postgres://...`."""
    answer = _update(api, token, app_name, dict(parse_pairs(pairs)))
    show(_rows(answer.secrets), COLUMNS, as_json, title=f"secrets of {app_name}")
    if not as_json:
        typer.echo(f"secrets version {answer.version}; {ROLL_OUT}", err=True)


@app.command("unset")
def unset(
    names: list[str] = typer.Argument(..., help="Names of the secrets to remove."),
    app_name: str = APP,
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """Remove secrets, all in one step."""
    answer = _update(api, token, app_name, dict.fromkeys(names))
    show(_rows(answer.secrets), COLUMNS, as_json, title=f"secrets of {app_name}")
    if not as_json:
        typer.echo(f"secrets version {answer.version}; {ROLL_OUT}", err=True)


@app.command("list")
def list_(
    app_name: str = APP,
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """The app's secrets: names and digests (a digest changes when the value does)."""

    async def go() -> list[AppSecret]:
        async with connect(api, token) as client:
            return (await client.secrets(app_name)).secrets

    show(_rows(run(go())), COLUMNS, as_json, title=f"secrets of {app_name}")

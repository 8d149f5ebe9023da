"""Where the CLI finds its broker, its token and the CA an https broker is checked against:
`--api`/`--token`/`souk --ca`, else `SOUK_API`/`SOUK_TOKEN`/`SOUK_CA`, else the files `souk dev`
writes (its CA only for its own broker), in the nearest `.souk-dev/` of the current directory
or one above it, so that commands run from an app's directory below find them."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from souk.cli.command import run
from souk.cli.options import grouped
from souk.clients.machines import MachinesClient

T = TypeVar("T")

DEV_DIR = Path(".souk-dev")
DEV_CA = Path("tls") / "trust.crt"  # below DEV_DIR: `souk dev --secure`'s CAs, for clients
DEFAULT_API = "http://127.0.0.1:4280"
TIMEOUT = 120.0  # for one answer; streams (logs --follow) have none

ApiOption = Annotated[
    str | None, typer.Option("--api", help="Broker URL (default: $SOUK_API, or souk dev's).")
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", help="Bearer token (default: $SOUK_TOKEN, or souk dev's)."),
]
AppOption = Annotated[str, typer.Option("--app", "-a", help="The app.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
CA = typer.Option(
    None,
    "--ca",
    envvar="SOUK_CA",
    exists=True,
    dir_okay=False,
    help="Check an https broker's certificate against this CA file instead of the system's.",
    resolve_path=True,
)

_chosen: dict[str, Path | None] = {"ca": None}  # `souk --ca`, for every command of this run


def use_ca(ca: Path | None) -> None:
    _chosen["ca"] = ca


def dev_dir(start: Path | None = None) -> Path | None:
    """The nearest `souk dev` data dir: `.souk-dev/` holding its API's address, in `start`
    (the current directory) or the first directory above it that has one."""
    here = (start or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        if (folder / DEV_DIR / "api").is_file():
            return folder / DEV_DIR
    return None


def dev_file(name: str) -> str | None:
    found = dev_dir()
    path = found / name if found is not None else None
    return path.read_text().strip() if path is not None and path.exists() else None


def api_url(api: str | None) -> str:
    return (api or os.environ.get("SOUK_API") or dev_file("api") or DEFAULT_API).rstrip("/")


def _find_token(token: str | None) -> str | None:
    return token or os.environ.get("SOUK_TOKEN") or dev_file("token")


def api_token(token: str | None) -> str:
    found = _find_token(token)
    if found is None:
        raise typer.BadParameter(
            "no token: pass --token, set SOUK_TOKEN, or run this below the directory `souk dev`"
            " runs in (its .souk-dev/token)"
        )
    return found


def api_ca(ca: Path | None, api: str | None) -> Path | None:
    """The CA file to check the broker against, or None for the system's CAs. `souk dev
    --secure`'s CA only when the broker is souk dev's too (no --api nor SOUK_API given)."""
    if ca is not None:
        return ca
    found = dev_dir()
    dev_ca = found / DEV_CA if found is not None else None
    if api is None and not os.environ.get("SOUK_API") and dev_ca is not None and dev_ca.exists():
        return dev_ca
    return None


def connect(api: str | None, token: str | None, optional_token: bool = False) -> MachinesClient:
    """A client of the broker (or, with `optional_token`, of a catalog node needing none)."""
    found = _find_token(token) if optional_token else api_token(token)
    return MachinesClient(api_url(api), found, TIMEOUT, ca=api_ca(_chosen["ca"], api))


def call(
    api: str | None,
    token: str | None,
    fn: Callable[[MachinesClient], Awaitable[T]],
    as_json: bool = False,
) -> T:
    """One call with a client of its own, errors reported the CLI's way (as JSON with
    `as_json`)."""

    async def go() -> T:
        async with connect(api, token) as client:
            return await fn(client)

    return run(go(), as_json)


@dataclass(frozen=True)
class Broker:
    """The broker a command asks, as `--api` and `--token` (or where they default to) say."""

    api: str | None
    token: str | None

    def client(self) -> MachinesClient:
        return connect(self.api, self.token)

    def call(self, fn: Callable[[MachinesClient], Awaitable[T]], as_json: bool = False) -> T:
        return call(self.api, self.token, fn, as_json)


def broker(api: ApiOption = None, token: TokenOption = None) -> Broker:
    """`--api` and `--token` (`grouped(broker=broker)`)."""
    return Broker(api, token)


@dataclass(frozen=True)
class OnApp:
    """What a command about one app's machines or volumes is given: the app, the broker it
    asks, and whether it prints JSON."""

    app: str
    broker: Broker
    as_json: bool

    def call(self, fn: Callable[[MachinesClient], Awaitable[T]]) -> T:
        return self.broker.call(fn)


@grouped(broker=broker)
def on_app(app: AppOption = "demo", *, broker: Broker, as_json: JsonOption = False) -> OnApp:
    """`--app`, `--api`, `--token` and `--json` (`grouped(on=on_app)`)."""
    return OnApp(app, broker, as_json)

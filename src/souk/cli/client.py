"""Where the CLI finds its broker and token: `--api`/`--token`, else `SOUK_API`/`SOUK_TOKEN`,
else the files `souk dev` writes."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from souk.clients.machines import MachinesClient

DEV_DIR = Path(".souk-dev")
DEFAULT_API = "http://127.0.0.1:4280"
TIMEOUT = 120.0  # for one answer; streams (logs --follow) have none

API = typer.Option(None, "--api", help="Broker URL (default: $SOUK_API, or souk dev's).")
TOKEN = typer.Option(None, "--token", help="Bearer token (default: $SOUK_TOKEN, or souk dev's).")


def _dev_file(name: str) -> str | None:
    path = DEV_DIR / name
    return path.read_text().strip() if path.exists() else None


def api_url(api: str | None) -> str:
    return (api or os.environ.get("SOUK_API") or _dev_file("api") or DEFAULT_API).rstrip("/")


def _find_token(token: str | None) -> str | None:
    return token or os.environ.get("SOUK_TOKEN") or _dev_file("token")


def api_token(token: str | None) -> str:
    found = _find_token(token)
    if found is None:
        raise typer.BadParameter("no token: pass --token or set SOUK_TOKEN")
    return found


def connect(api: str | None, token: str | None, optional_token: bool = False) -> MachinesClient:
    """A client of the broker (or, with `optional_token`, of a catalog node needing none)."""
    found = _find_token(token) if optional_token else api_token(token)
    return MachinesClient(api_url(api), found, TIMEOUT)

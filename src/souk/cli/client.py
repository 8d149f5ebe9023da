"""A small synchronous client of the Machines API for the CLI, and its output helpers."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

DEV_DIR = Path(".souk-dev")


def api_url(api: str | None) -> str:
    if api:
        return api.rstrip("/")
    if os.environ.get("SOUK_API"):
        return os.environ["SOUK_API"].rstrip("/")
    if (DEV_DIR / "api").exists():
        return (DEV_DIR / "api").read_text().strip()
    return "http://127.0.0.1:4280"


def api_token(token: str | None) -> str:
    if token:
        return token
    if os.environ.get("SOUK_TOKEN"):
        return os.environ["SOUK_TOKEN"]
    if (DEV_DIR / "token").exists():
        return (DEV_DIR / "token").read_text().strip()
    raise typer.BadParameter("no token: pass --token or set SOUK_TOKEN")


def call(
    method: str,
    path: str,
    api: str | None,
    token: str | None,
    body: Any = None,
    params: dict[str, str] | None = None,
    raw: bool = False,
    optional_token: bool = False,
) -> Any:
    url = api_url(api) + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if not optional_token or token or os.environ.get("SOUK_TOKEN") or (DEV_DIR / "token").exists():
        req.add_header("Authorization", f"Bearer {api_token(token)}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            payload = resp.read()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            err = json.loads(text)
            message = f"{err.get('status')}: {err.get('error')}"
            if err.get("details", {}).get("refusals"):
                message += "".join(
                    f"\n  {r['worker']}: {r['reason']}" for r in err["details"]["refusals"]
                )
        except ValueError:
            message = text
        typer.echo(f"error {exc.code} {message}", err=True)
        raise typer.Exit(1) from None
    except urllib.error.URLError as exc:
        typer.echo(f"cannot reach {url}: {exc.reason}", err=True)
        raise typer.Exit(1) from None
    if raw:
        return payload
    return json.loads(payload) if payload else None


def show(rows: list[dict[str, Any]], columns: list[str], as_json: bool, title: str = "") -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(*columns, title=title or None)
    for row in rows:
        table.add_row(*(str(row.get(c, "")) for c in columns))
    Console().print(table)

"""`souk tokens`: mint bearer tokens from the cluster secret, or make a new secret."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from souk.broker import tokens as tk
from souk.models.duration import parse_duration

app = typer.Typer(help="Mint bearer tokens for the Machines API.", no_args_is_help=True)


@app.command("create")
def create(
    secret_file: Path = typer.Option(..., help="File holding the cluster secret."),
    app_name: list[str] = typer.Option(
        [], "--app", help="Only this app (repeat for several; default: every app)."
    ),
    read_only: bool = typer.Option(False, help="Only reads: lists, gets, waits, events."),
    operator: bool = typer.Option(False, help="Also fleet operations (cordon workers)."),
    ttl: str | None = typer.Option(None, help="Valid for this long, e.g. 1h, 30m, 3600."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object, not the bare token."),
) -> None:
    """Print a new token signed with the cluster secret."""
    try:
        secret = tk.read_secret(secret_file)
        seconds = parse_duration(ttl) if ttl is not None else None
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    token = tk.mint(
        secret, apps=app_name or None, read_only=read_only, operator=operator, ttl=seconds
    )
    if as_json:
        grant = tk.verify(token, secret)
        apps = sorted(grant.apps) if grant.apps is not None else None
        print(
            json.dumps(
                {
                    "token": token,
                    "apps": apps,
                    "read_only": grant.read_only,
                    "operator": grant.operator,
                    "expires": grant.expires,
                }
            )
        )
    else:
        print(token)


@app.command("secret")
def secret(
    out: Path = typer.Option(..., help="Write a new cluster secret here (mode 0600)."),
    force: bool = typer.Option(False, help="Overwrite an existing file."),
) -> None:
    """Generate a cluster secret. Every broker of a cluster must read the same one."""
    if out.exists() and not force:
        raise typer.BadParameter(f"{out} exists; pass --force to replace it")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(tk.new_secret() + b"\n")
    print(f"wrote a new cluster secret to {out}")

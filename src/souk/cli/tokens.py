"""`souk tokens`: mint tokens from the cluster secret, narrow them without it, revoke them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from souk.broker import tokens as tk
from souk.cli.client import Broker, broker
from souk.cli.options import grouped
from souk.models.catalog import RevocationRow
from souk.models.duration import parse_duration
from souk.node.cluster_secret import create_secret, read_secret

app = typer.Typer(
    help="Tokens for the Machines API: mint, attenuate, inspect, revoke.", no_args_is_help=True
)

APP_HELP = "Only this app (repeatable)."
ACTION_HELP = "Only this kind of request: read, write (operate machines) or deploy (repeatable)."
MACHINE_HELP = "Only this machine id (repeatable)."
REGION_HELP = "Only machines in this region (repeatable)."
EXPIRES_HELP = "Valid for this long from now, e.g. 1h, 30m, 3600."


def _caveats(
    apps: list[str],
    actions: list[str],
    machines: list[str],
    regions: list[str],
    expires: str | None,
) -> list[str]:
    """The options as caveats, each checked as a broker will check it."""
    caveats: list[str] = []
    if apps:
        caveats.append(tk.apps_caveat(apps))
    if actions:
        caveats.append(tk.actions_caveat(actions))
    if machines:
        caveats.append(tk.machines_caveat(machines))
    if regions:
        caveats.append(tk.regions_caveat(regions))
    try:
        if expires is not None:
            caveats.append(tk.expires_caveat(time.time() + parse_duration(expires)))
        for caveat in caveats:
            tk.parse_caveat(caveat)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except tk.TokenError as exc:
        raise typer.BadParameter(exc.message) from exc
    return caveats


def _describe(token: str) -> dict[str, object]:
    token_id, operator, caveats = tk.inspect(token)
    return {"token": token, "id": token_id, "operator": operator, "caveats": caveats}


def _print(token: str, as_json: bool) -> None:
    print(json.dumps(_describe(token)) if as_json else token)


@app.command("create")
def create(
    secret_file: Path = typer.Option(
        ..., help="File holding the cluster secret.", resolve_path=True
    ),
    app_name: list[str] = typer.Option([], "--app", help=APP_HELP + " Default: every app."),
    action: list[str] = typer.Option([], "--action", help=ACTION_HELP),
    machine: list[str] = typer.Option([], "--machine", help=MACHINE_HELP),
    region: list[str] = typer.Option([], "--region", help=REGION_HELP),
    read_only: bool = typer.Option(False, help="Same as --action read."),
    operator: bool = typer.Option(False, help="Also fleet operations: workers, catalog, revoke."),
    ttl: str | None = typer.Option(None, "--ttl", "--expires", help=EXPIRES_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object, not the bare token."),
) -> None:
    """Print a new token signed with the cluster secret, with a fresh id."""
    try:
        secret = read_secret(secret_file)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    actions = [*action, *(["read"] if read_only else [])]
    caveats = _caveats(app_name, actions, machine, region, ttl)
    token = tk.mint(secret, operator=operator, caveats=caveats)
    if not as_json:
        print(token)
        return
    grant = tk.verify(token, secret)
    listed = {k: None if v is None else sorted(v) for k, v in _sets(grant).items()}
    print(json.dumps({**_describe(token), **listed, "expires": grant.expires}))


def _sets(grant: tk.Grant) -> dict[str, frozenset[str] | None]:
    return {
        "apps": grant.apps,
        "actions": grant.actions,
        "machines": grant.machines,
        "regions": grant.regions,
    }


@app.command("attenuate")
def attenuate(
    token: str = typer.Argument(..., help="The token to narrow ('-': read it from stdin)."),
    app_name: list[str] = typer.Option([], "--app", help=APP_HELP),
    action: list[str] = typer.Option([], "--action", help=ACTION_HELP),
    machine: list[str] = typer.Option([], "--machine", help=MACHINE_HELP),
    region: list[str] = typer.Option([], "--region", help=REGION_HELP),
    expires: str | None = typer.Option(None, help=EXPIRES_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object, not the bare token."),
) -> None:
    """Print a copy of TOKEN that allows less: needs no secret, can never allow more.

    Each option adds a caveat; a request must satisfy all of the token's caveats, so, e.g.,
    --app a on a token already limited to apps a and b leaves it valid for a alone."""
    text = (typer.get_text_stream("stdin").read() if token == "-" else token).strip()
    caveats = _caveats(app_name, action, machine, region, expires)
    if not caveats:
        raise typer.BadParameter("say what to narrow: --app, --action, --machine, --region, ...")
    try:
        narrowed = tk.attenuate(text, caveats)
    except tk.TokenError as exc:
        raise typer.BadParameter(exc.message) from exc
    _print(narrowed, as_json)


@app.command("inspect")
def inspect(
    token: str = typer.Argument(..., help="The token ('-': read it from stdin)."),
) -> None:
    """Show a token's id and caveats, as it states them (not verified: no secret needed)."""
    text = (typer.get_text_stream("stdin").read() if token == "-" else token).strip()
    try:
        described = _describe(text)
    except tk.TokenError as exc:
        raise typer.BadParameter(exc.message) from exc
    described.pop("token")
    print(json.dumps(described, indent=2))


@app.command("revoke")
@grouped(broker=broker)
def revoke(
    token_id: str = typer.Argument(..., help="The token id (souk tokens inspect shows it)."),
    *,
    broker: Broker,
) -> None:
    """Revoke a token id, and so every token attenuated from it, on every broker (an operator
    token)."""
    if not tk.TOKEN_ID.fullmatch(token_id):
        raise typer.BadParameter("a token id is 16 hex digits; souk tokens inspect shows it")
    row: RevocationRow = broker.call(lambda client: client.revoke_token(token_id))
    print(f"revoked {row.id} at {row.revoked_at}")


@app.command("secret")
def secret(
    out: Path = typer.Option(
        ..., help="Write a new cluster secret here (mode 0600).", resolve_path=True
    ),
    force: bool = typer.Option(False, help="Overwrite an existing file."),
) -> None:
    """Generate a cluster secret. Every broker of a cluster must read the same one."""
    try:
        create_secret(out, replace=force)
    except FileExistsError:
        raise typer.BadParameter(f"{out} exists; pass --force to replace it") from None
    print(f"wrote a new cluster secret to {out}")

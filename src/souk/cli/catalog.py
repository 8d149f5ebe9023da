"""`souk catalog`: run a replica on its own, and look at one."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import typer
from aiohttp import web
from aiohttp.typedefs import Middleware
from rich.table import Table

from souk import __version__, heap
from souk.broker.auth import make_auth
from souk.catalog import http as catalog_http
from souk.catalog.bus import NatsBus
from souk.catalog.certs import bus_options
from souk.catalog.connecting import ConnectingBus
from souk.catalog.metrics import watch_replica
from souk.catalog.protocol import HELLO
from souk.catalog.replica import Replica, following
from souk.catalog.trust import CaTrust, Trust
from souk.cli.client import connect
from souk.cli.command import console, run
from souk.cli.options import grouped
from souk.cli.serving import (
    Logging,
    listener,
    log_to_stderr,
    logging_options,
    parse_listen,
    secret_option,
)
from souk.node.signals import until_signalled
from souk.node.site import served
from souk.pki import NodeFiles, PkiError, load_cas
from souk.web import Permission, Route, add_routes, error_middleware, open_access
from souk.web.listener import DEFAULT_LIMITS, Limits
from souk.web.metrics import METRICS_PATH, Metrics, serve_metrics

app = typer.Typer(help="The catalog: every worker's rows, replicated.", no_args_is_help=True)


@app.command()
@grouped(logs=logging_options, limits=listener)
def serve(
    nats: str = typer.Option(..., help="NATS server URL(s), comma-separated."),
    listen: str = typer.Option("127.0.0.1:4290", help="HOST:PORT of its catalog HTTP API."),
    data_dir: Path | None = typer.Option(None, help="Keep its SQLite copy here (else memory)."),
    region: list[str] = typer.Option([], help="Follow only this region (repeatable)."),
    unreachable_after: float = typer.Option(3.0, help="Seconds of silence before unreachable."),
    secret_file: Path | None = typer.Option(
        None,
        help="The cluster secret: with it every request needs a token, checked as a broker"
        " does; without, anyone who reaches it reads everything.",
    ),
    tls_dir: Path | None = typer.Option(
        None,
        file_okay=False,
        help="This node's files (`souk certs issue --out DIR`): mutual TLS to the bus, and "
        "only rows their owners signed, checked against the ca.crt there.",
    ),
    tls_name: str | None = typer.Option(
        None, help="NAME of the files in --tls-dir (default: the one NAME.key there)."
    ),
    ca: Path | None = typer.Option(
        None, dir_okay=False, help="The cluster CA alone: only signed rows, on an open bus."
    ),
    insecure: bool = typer.Option(False, help="Apply unsigned rows (a bus like `souk dev`'s)."),
    *,
    logs: Logging,
    limits: Limits,
) -> None:
    """Follow the catalog and serve it over HTTP (read-only). Without --secret-file it checks
    no tokens: bind it to a private address."""
    log_to_stderr(logs.level, logs.format, "catalog", "catalog")
    host, port = parse_listen(listen)
    secret = secret_option(secret_file) if secret_file is not None else None
    if [tls_dir is not None, ca is not None, insecure].count(True) != 1:
        raise typer.BadParameter("give one of --tls-dir, --ca (signed) or --insecure")
    trust: Trust | None = None
    options: dict[str, Any] = {}
    try:
        if tls_dir is not None:
            files = NodeFiles.find(tls_dir, tls_name)
            options = bus_options(files)
            trust = CaTrust(load_cas(files.ca))
        elif ca is not None:
            trust = CaTrust(load_cas(ca))
    except PkiError as exc:
        raise typer.BadParameter(str(exc)) from None
    asyncio.run(
        _serve(
            nats,
            host,
            port,
            data_dir,
            region or None,
            unreachable_after,
            trust,
            options,
            secret,
            limits,
        )
    )


def catalog_app(replica: Replica, secret: bytes | None) -> web.Application:
    """The catalog's routes behind the broker's token check when there is a secret (revocations
    come from the replica itself), or open to anyone who reaches them when there is none."""
    access: Middleware = open_access
    if secret is not None:

        def machine_region(app_name: str, machine_id: str) -> str | None:
            row = replica.machine(machine_id)
            return row.region if row is not None and row.app == app_name else None

        access = make_auth(secret, replica.revoked, machine_region)
    http = web.Application(middlewares=[error_middleware, access])
    metrics = Metrics("souk_catalog_node")
    watch_replica(metrics, replica)
    own = Route(
        "GET",
        METRICS_PATH,
        serve_metrics(metrics),
        "Prometheus metrics (text format)",
        permission=Permission.operator("read"),
    )
    add_routes(http, [*catalog_http.routes(replica), own], "souk catalog", __version__)
    return http


@contextlib.asynccontextmanager
async def catalog_site(
    replica: Replica, host: str, port: int, secret: bytes | None, limits: Limits = DEFAULT_LIMITS
) -> AsyncIterator[str]:
    """`catalog_app` served as souk serves everything; yields its base URL."""
    async with served(catalog_app(replica, secret), host, port, limits=limits) as url:
        yield url


async def _serve(
    nats: str,
    host: str,
    port: int,
    data_dir: Path | None,
    regions: list[str] | None,
    unreachable_after: float,
    trust: Trust | None,
    bus_options: dict[str, Any],
    secret: bytes | None,
    limits: Limits,
) -> None:
    path: Path | str = ":memory:"
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / "catalog.db"
    # Serve at once even with NATS down; the replica catches up from the owners once connected.
    bus = ConnectingBus(
        lambda: NatsBus.connect(nats, name="souk-catalog", **bus_options), f"NATS {nats}"
    )
    bus.on_connect(lambda: bus.publish(HELLO, b"{}"))  # owners answer with a heartbeat
    bus.start()
    up = await bus.wait_connected(0.5)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(bus.close)
        replica = await stack.enter_async_context(
            following(bus, path, regions, trust=trust, bootstrap=up, settle=2.0 if up else 0.0)
        )
        replica.unreachable_after = unreachable_after
        url = await stack.enter_async_context(catalog_site(replica, host, port, secret, limits))
        heap.settle()
        print(f"souk catalog ready on {url}", flush=True)
        await until_signalled()


@app.command()
def status(
    api: str | None = typer.Option(None, help="A catalog node: a broker or `souk catalog serve`."),
    token: str | None = typer.Option(None, help="Bearer token (for a broker)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Per-owner heads and lag, unreachable workers and quarantined rows."""

    async def go() -> dict[str, Any]:
        async with connect(api, token, optional_token=True) as client:
            return await client.catalog_status()

    data = run(go())
    if as_json:
        print(json.dumps(data, indent=2))
        return
    bus = data.get("bus", "connected")
    shown = bus if bus == "connected" else f"[red]{bus}[/red]: rows may be stale"
    table = Table(
        "owner",
        "region",
        "head",
        "lag",
        "silent (s)",
        "reachable",
        title=f"{data['replica']} (bus {shown})",
    )
    for o in data["owners"]:
        reachable = "[red]no[/red]" if o["unreachable"] else "yes"
        silent = "" if o["silent_for"] is None else f"{o['silent_for']:.1f}"
        table.add_row(o["owner"], o["region"], str(o["head"]), str(o["lag"]), silent, reachable)
    out = console()
    out.print(table)
    if data["quarantined"]:
        bad = Table("owner", "table", "key", "seq", "error", title="quarantined rows")
        for q in data["quarantined"]:
            bad.add_row(q["owner"], q["table"], q["key"], str(q["seq"]), q["error"][:120])
        out.print(bad)
    stats = ", ".join(f"{k} {v}" for k, v in sorted(data["stats"].items()))
    out.print(f"[dim]{stats}[/dim]")
    refused = ", ".join(f"{k} {v}" for k, v in sorted(data.get("refused", {}).items()))
    out.print(f"{data.get('security', 'insecure')}; refused: {refused or 'nothing'}")

"""`souk proxy`: the HTTP edge. Routes requests to an app's machines, starts stopped ones on
demand and stops idle ones, reading the fleet from a catalog replica."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from souk.cli.client import CA, api_ca, api_token, api_url
from souk.cli.config_file import CONFIG, PRINT_CONFIG, show_config
from souk.cli.serving import (
    HEAD_TIMEOUT,
    KEEPALIVE_TIMEOUT,
    LOG_FORMAT,
    LOG_LEVEL,
    MAX_CONNECTIONS,
    MAX_PER_CLIENT,
    METRICS,
    listener_limits,
    log_to_stderr,
    parse_listen,
    refusals,
)
from souk.cli.tls import TLS_CERT, TLS_DIR_HELP, TLS_KEY, part_tls, server_cert
from souk.models.wire import DEFAULT_PRIVATE_PREFIX, private_prefix_error


def run(
    ctx: typer.Context,
    listen: str = typer.Option("127.0.0.1:4300", help="HOST:PORT the proxy listens on."),
    nats: str = typer.Option(..., help="NATS server URL(s), comma-separated: the catalog."),
    domain: str = typer.Option(
        "souk.local", help="Requests for <app>.<domain> go to the app (or send `souk-app: <app>`)."
    ),
    region: str | None = typer.Option(
        None, help="The proxy's own region: its machines are preferred."
    ),
    idle_timeout: float = typer.Option(
        60.0, min=0.1, help="Seconds without requests before an autostop machine is stopped."
    ),
    start_timeout: float = typer.Option(
        10.0, min=0.1, help="Seconds a request waits for a stopped machine to start and accept."
    ),
    autostop: bool = typer.Option(
        True, help="Stop idle machines (with several proxies, let one of them do it)."
    ),
    api: str | None = typer.Option(
        None, help="The broker's URL (default: SOUK_API, .souk-dev/api, 127.0.0.1:4280)."
    ),
    token: str | None = typer.Option(
        None, help="Bearer token for the broker (default: SOUK_TOKEN, .souk-dev/token)."
    ),
    catalog_dir: Path | None = typer.Option(
        None,
        help="Keep the catalog replica's SQLite copy here (default: in memory).",
        resolve_path=True,
    ),
    ca: Path | None = CA,
    tls_cert: Path | None = TLS_CERT,
    tls_key: Path | None = TLS_KEY,
    tls_dir: Path | None = typer.Option(
        None,
        help=f"{TLS_DIR_HELP} Reach the bus with them and apply only catalog rows their "
        "owners signed.",
        resolve_path=True,
    ),
    tls_name: str | None = typer.Option(
        None, help="This proxy's name in --tls-dir (default: the one key there)."
    ),
    insecure: bool = typer.Option(
        False, help="Without --tls-dir: follow an open bus other than loopback, unsigned rows."
    ),
    mesh_port: int | None = typer.Option(
        None, help="Join the private network's WireGuard mesh on this UDP port (docs/network.md)."
    ),
    mesh_endpoint: str | None = typer.Option(
        None, help="HOST:PORT other hosts reach --mesh-port at."
    ),
    mesh_dir: Path | None = typer.Option(None, help="Where the mesh key is kept (0600)."),
    mesh_name: str = typer.Option("proxy", help="This host's name on the mesh."),
    private_prefix: str = typer.Option(
        DEFAULT_PRIVATE_PREFIX, help="The cluster's /48 of private addresses (a ULA prefix)."
    ),
    metrics: bool = METRICS,
    max_connections: int = MAX_CONNECTIONS,
    max_connections_per_client: int = MAX_PER_CLIENT,
    head_timeout: float = HEAD_TIMEOUT,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT,
    log_level: str = LOG_LEVEL,
    log_format: str = LOG_FORMAT,
    config: Path | None = CONFIG,
    print_config: bool = PRINT_CONFIG,
) -> None:
    """Serve HTTP for every app: route to started machines, scale from zero, stop idle ones."""
    if print_config:
        show_config(ctx)
        return
    from souk.proxy.server import ProxySettings, serve

    log_to_stderr(log_level, log_format, "proxy", "proxy")
    host, port = parse_listen(listen)
    tls = part_tls("proxy", tls_dir, tls_name, insecure, nats)
    listener = server_cert(tls_cert, tls_key)
    url = api_url(api)
    if (why := private_prefix_error(private_prefix)) is not None:
        raise typer.BadParameter(why, param_hint="--private-prefix")
    opts = ProxySettings(
        host=host,
        port=port,
        api=url,
        token=api_token(token),
        domain=domain,
        region=region,
        idle_timeout=idle_timeout,
        start_timeout=start_timeout,
        autostop=autostop,
        nats=nats,
        catalog_dir=catalog_dir,
        ca=api_ca(ca, api),
        listener=listener,
        tls=tls,
        metrics=metrics,
        mesh_port=mesh_port,
        mesh_endpoint=mesh_endpoint,
        mesh_dir=mesh_dir,
        mesh_name=mesh_name,
        private_prefix=private_prefix,
        limits=listener_limits(
            max_connections, max_connections_per_client, head_timeout, keepalive_timeout
        ),
    )
    with refusals("proxy"):
        asyncio.run(serve(opts))

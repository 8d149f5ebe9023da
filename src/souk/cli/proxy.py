"""`souk proxy`: the HTTP edge. Routes requests to an app's machines, starts stopped ones on
demand and stops idle ones, reading the fleet from a catalog replica."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from souk.cli import serving
from souk.cli.client import CA, api_ca, api_token, api_url
from souk.cli.options import grouped
from souk.cli.serving import log_to_stderr
from souk.cli.tls import TLS_CERT, TLS_DIR_HELP, TLS_KEY, part_tls, server_cert
from souk.models.wire import DEFAULT_PRIVATE_PREFIX


@grouped(part=serving.part_options)
def run(
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
    mesh_port: serving.MeshPort = None,
    mesh_endpoint: serving.MeshEndpoint = None,
    mesh_dir: Path | None = typer.Option(None, help="Where the mesh key is kept (0600)."),
    mesh_name: str = typer.Option("proxy", help="This host's name on the mesh."),
    private_prefix: serving.PrivatePrefix = DEFAULT_PRIVATE_PREFIX,
    *,
    part: serving.Part,
) -> None:
    """Serve HTTP for every app: route to started machines, scale from zero, stop idle ones."""
    from souk.proxy.server import ProxySettings, serve

    log_to_stderr(part.logs.level, part.logs.format, "proxy", "proxy")
    host, port = serving.parse_listen(listen)
    tls = part_tls("proxy", tls_dir, tls_name, insecure, nats)
    listener = server_cert(tls_cert, tls_key)
    url = api_url(api)
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
        metrics=part.metrics,
        mesh_port=mesh_port,
        mesh_endpoint=mesh_endpoint,
        mesh_dir=mesh_dir,
        mesh_name=mesh_name,
        private_prefix=private_prefix,
        limits=part.limits,
    )
    with serving.refusals("proxy"):
        asyncio.run(serve(opts))

"""`souk nats`: the bus's own configuration."""

from __future__ import annotations

from pathlib import Path

import typer

from souk.catalog.permissions import ConfigError, parse_node, render
from souk.pki import NodeFiles, PkiError

app = typer.Typer(help="The NATS bus: an authenticated configuration.", no_args_is_help=True)


@app.command()
def config(
    tls_dir: Path = typer.Option(
        ...,
        exists=True,
        file_okay=False,
        help="The bus's node files, as `souk certs issue --role bus --out DIR` writes them: "
        "NAME.crt, NAME.key and the cluster's ca.crt.",
        resolve_path=True,
    ),
    tls_name: str | None = typer.Option(
        None, help="NAME of the files in --tls-dir (default: the one NAME.key there)."
    ),
    out: Path = typer.Option(..., help="Write the configuration here.", resolve_path=True),
    node: list[str] = typer.Option(
        [], help="A node allowed on the bus, ROLE:NAME or worker:NAME@REGION (repeatable)."
    ),
    host: str = typer.Option(
        "0.0.0.0", help="Address it listens on (default: every address of the host)."
    ),
    port: int = typer.Option(4222, help="Port clients connect to."),
    cluster: str = typer.Option(
        "", help="Routes to the other servers, comma-separated (nats-route://host:6222)."
    ),
    cluster_port: int = typer.Option(6222, help="Port for routes from the other servers."),
) -> None:
    """Write a nats-server configuration with mutual TLS, one user per node (mapped from its
    certificate) and subject permissions by role; no anonymous access."""
    try:
        server = NodeFiles.find(tls_dir, tls_name)
        server.check(role="bus")
    except PkiError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tls-dir") from None
    try:
        nodes = [parse_node(n) for n in node]
        routes = [r.strip() for r in cluster.split(",") if r.strip()]
        text = render(nodes, server, host, port, routes, cluster_port)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    out.write_text(text)
    where = f"{host}:{port}" + (
        " (every address of this host: --host to narrow)" if host == "0.0.0.0" else ""
    )
    typer.echo(f"wrote {out}: {len(nodes)} nodes; clients connect on {where}")
    if routes:
        typer.echo(f"routes from the other servers on {host}:{cluster_port}")

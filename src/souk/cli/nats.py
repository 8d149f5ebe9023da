"""`souk nats`: the bus's own configuration."""

from __future__ import annotations

from pathlib import Path

import typer

from souk.catalog.permissions import ConfigError, parse_node, render

app = typer.Typer(help="The NATS bus: an authenticated configuration.", no_args_is_help=True)


@app.command()
def config(
    ca: Path = typer.Option(..., exists=True, dir_okay=False, help="The cluster CA (PEM)."),
    server_cert: Path = typer.Option(..., exists=True, dir_okay=False, help="Server cert (PEM)."),
    server_key: Path = typer.Option(..., exists=True, dir_okay=False, help="Its key (PEM)."),
    out: Path = typer.Option(..., help="Write the configuration here."),
    node: list[str] = typer.Option(
        [], help="A node allowed on the bus, ROLE:NAME or worker:NAME@REGION (repeatable)."
    ),
    host: str = typer.Option("0.0.0.0", help="Address clients connect to."),
    port: int = typer.Option(4222, help="Port clients connect to."),
    cluster: str = typer.Option(
        "", help="Routes to the other servers, comma-separated (nats-route://host:6222)."
    ),
    cluster_port: int = typer.Option(6222, help="Port for routes from the other servers."),
) -> None:
    """Write a nats-server configuration with mutual TLS, one user per node (mapped from its
    certificate) and subject permissions by role; no anonymous access."""
    try:
        nodes = [parse_node(n) for n in node]
        routes = [r.strip() for r in cluster.split(",") if r.strip()]
        text = render(nodes, ca, server_cert, server_key, host, port, routes, cluster_port)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    out.write_text(text)
    typer.echo(f"wrote {out}: {len(nodes)} nodes")

"""Entry point: assembles the subcommands of every part into one Typer app."""

from __future__ import annotations

from pathlib import Path

import typer

from souk.cli import (
    broker,
    catalog,
    client,
    machines,
    nats,
    operations,
    pki,
    proxy,
    secrets,
    tokens,
    volumes,
    worker,
)
from souk.cli.deploy import commands as deploy

app = typer.Typer(
    name="souk",
    help="souk: a cluster orchestrator that schedules like a market.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def main(ca: Path | None = client.CA) -> None:
    """souk: a cluster orchestrator that schedules like a market."""
    client.use_ca(ca)


app.command("worker")(worker.run)
app.add_typer(tokens.app, name="tokens")
app.command("broker")(broker.run)
app.command("dev")(broker.dev)
app.add_typer(machines.machines, name="machines")
app.add_typer(machines.apps, name="apps")
app.add_typer(secrets.app, name="secrets")
app.add_typer(volumes.volumes, name="volumes")
app.add_typer(catalog.app, name="catalog")
app.add_typer(nats.app, name="nats")
app.command("proxy")(proxy.run)
app.add_typer(pki.ca, name="ca")
app.add_typer(pki.certs, name="certs")
app.add_typer(operations.backups, name="backup")
app.add_typer(operations.units, name="systemd")
deploy.register(app)  # deploy, releases, rollback, scale, status, logs

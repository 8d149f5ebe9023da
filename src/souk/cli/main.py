"""Entry point: assembles the subcommands of every part into one Typer app."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from souk.cli import (
    broker,
    catalog,
    client,
    machines,
    mesh,
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
app.add_typer(mesh.app, name="mesh")
app.add_typer(operations.backups, name="backup")
app.add_typer(operations.units, name="systemd")
deploy.register(app)  # deploy, releases, rollback, scale, status, logs


def plain_help(command: Any) -> None:
    """Help that names what a value is, not its Python type: a flag shows none (typer would
    show `<bool>`), an option its name (`--data-dir DATA_DIR`, not `<path>` or `<list[str]>`)."""
    for param in command.params:
        if param.metavar is None:
            param.metavar = "" if getattr(param, "is_flag", False) else param.name.upper()
    made = command.get_help_option  # --help is made per run, not among the params

    def help_option(ctx: Any) -> Any:
        option = made(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)


def entry() -> None:
    """The `souk` program: a bad flag or argument is one line naming the command and how to
    get its help, exit 2, not a usage box (the command's own refusals say theirs the same
    way, see `command.fail` and `serving.refuse`)."""
    command = typer.main.get_command(app)
    plain_help(command)
    try:
        code = command.main(prog_name="souk", standalone_mode=False)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    except typer.TyperException as exc:  # click's usage errors, as typer carries them
        if type(exc).__name__ == "NoArgsIsHelpError":  # `souk` alone: its help
            exc.show()  # type: ignore[attr-defined]
            sys.exit(0)
        ctx = getattr(exc, "ctx", None)
        name = ctx.command_path if ctx is not None else "souk"
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        typer.echo(f"{name}: {message} (see {name} --help)", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)

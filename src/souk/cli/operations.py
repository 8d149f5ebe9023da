"""`souk backup` and `souk systemd`: what an operator runs around the parts, not inside them."""

from __future__ import annotations

import shlex
import shutil
import sqlite3
import sys
from pathlib import Path

import typer

from souk.schema import backup as copy_database

backups = typer.Typer(
    help="Consistent copies of a part's database, taken while it runs.", no_args_is_help=True
)
units = typer.Typer(help="systemd units for the parts of a cluster.", no_args_is_help=True)


def _backup(source: Path, dest: Path) -> None:
    if not source.is_file():
        typer.echo(f"souk backup: no database at {source}", err=True)
        raise typer.Exit(2)
    if dest.exists():
        typer.echo(f"souk backup: {dest} exists; name a new file", err=True)
        raise typer.Exit(2)
    conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        copy_database(conn, dest.absolute())
    except sqlite3.Error as exc:
        typer.echo(f"souk backup: {source}: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        conn.close()
    typer.echo(f"{source} -> {dest}")


DEST = typer.Argument(..., help="The copy to write (a new file, mode 0600).")


@backups.command("worker")
def backup_worker(
    data_dir: Path = typer.Option(..., help="The worker's --data-dir."),
    dest: Path = DEST,
) -> None:
    """Copy a worker's database (its machines, volumes, operation log), running or not.

    To restore: stop the worker, put the copy at DATA_DIR/worker.db (removing worker.db-wal and
    worker.db-shm), start it: it adopts the machines still running and resumes the rest."""
    _backup(data_dir / "worker.db", dest)


@backups.command("registry")
def backup_registry(
    app_registry: Path = typer.Option(..., help="The broker's --app-registry directory."),
    dest: Path = DEST,
) -> None:
    """Copy the app registry (apps, their metadata, secrets and releases, revocations)."""
    _backup(app_registry / "apps.db", dest)


# Every part but the worker runs sandboxed: a user of its own, nothing of the host it does not
# need. The worker keeps its machines across its own restart (it adopts them), so only its main
# process is signalled; it needs root and the host's cgroups, mounts and namespaces, so it gets
# no sandboxing it would trip on.
_SANDBOX = (
    "DynamicUser=yes",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectControlGroups=yes",
    "LimitNOFILE=65536",
)
_INTERNET = "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX"


def _state(part: str) -> tuple[str, ...]:
    return (f"StateDirectory=souk/{part}", "StateDirectoryMode=0700")


_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "worker": (
        "a souk worker: runs this host's machines",
        ("KillMode=process", "Delegate=yes", "LimitNOFILE=1048576", *_state("worker")),
    ),
    "broker": (
        "a souk broker: the Machines API and placement",
        (*_SANDBOX, _INTERNET, *_state("broker")),
    ),
    "proxy": (
        "a souk proxy: routes HTTP to machines, starts them on demand",
        (*_SANDBOX, _INTERNET, "AmbientCapabilities=CAP_NET_BIND_SERVICE", *_state("proxy")),
    ),
}


def render_unit(description: str, argv: list[str], service: tuple[str, ...]) -> str:
    """A systemd unit running `argv`, restarted on failure, its files 0600 by default."""
    lines = [
        "[Unit]",
        f"Description={description}",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=exec",
        f"ExecStart={shlex.join(argv)}",
        "Restart=on-failure",
        "RestartSec=2s",
        "TimeoutStopSec=30s",
        "UMask=0077",
        *service,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


CONFIG = typer.Option(None, help="The part's configuration file (default /etc/souk/PART.toml).")


def _program() -> str:
    """The souk this command runs as: the unit should start the same installation."""
    if Path(sys.argv[0]).name == "souk":
        return str(Path(sys.argv[0]).absolute())
    return shutil.which("souk") or "/usr/local/bin/souk"


def _print_part(part: str, config: Path | None) -> None:
    description, service = _PARTS[part]
    argv = [_program(), part, "--config", str(config or Path(f"/etc/souk/{part}.toml"))]
    typer.echo(render_unit(description, argv, service), nl=False)


@units.command("worker")
def unit_worker(config: Path | None = CONFIG) -> None:
    """A unit for `souk worker`: its machines outlive a restart of it."""
    _print_part("worker", config)


@units.command("broker")
def unit_broker(config: Path | None = CONFIG) -> None:
    """A unit for `souk broker`, sandboxed."""
    _print_part("broker", config)


@units.command("proxy")
def unit_proxy(config: Path | None = CONFIG) -> None:
    """A unit for `souk proxy`, sandboxed, allowed to bind ports below 1024."""
    _print_part("proxy", config)


@units.command("nats")
def unit_nats(
    config: Path = typer.Option(
        Path("/etc/souk/nats.conf"), help="The file `souk nats config --out` wrote."
    ),
) -> None:
    """A unit for nats-server with souk's bus configuration."""
    argv = ["/usr/bin/nats-server", "-c", str(config)]
    service = (*_SANDBOX, "ExecReload=/bin/kill -HUP $MAINPID")
    typer.echo(render_unit("the NATS bus of a souk cluster", argv, service), nl=False)

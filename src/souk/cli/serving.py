"""What every long-running command (worker, broker, proxy, catalog, dev) shares: the address
it listens on, the limits of its listener (`souk.web.listener`), how it logs (`souk.logsetup`)
and how it refuses to start (one line, exit 2)."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from souk import logsetup
from souk.cli.config_file import CONFIG, PRINT_CONFIG, show_config
from souk.cli.options import grouped
from souk.models.wire import private_prefix_error
from souk.node.cluster_secret import read_secret
from souk.schema import SchemaTooNew
from souk.web.listener import DEFAULT_LIMITS as _LIMITS
from souk.web.listener import Limits
from souk.worker.machines.app_users import closed_above

LogLevel = Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")]
LogFormat = Annotated[
    str,
    typer.Option(
        "--log-format",
        help="text, or json: one object per line, each with the resource it is about and its "
        "state.",
    ),
]
MaxConnections = Annotated[
    int,
    typer.Option(
        "--max-connections",
        min=1,
        help="Connections open at once, at most; one more is closed as it comes.",
    ),
]
MaxPerClient = Annotated[
    int,
    typer.Option(
        "--max-connections-per-client",
        min=1,
        help="Connections open at once from one address (IPv6: one /64); behind a load "
        "balancer or NAT, raise it to --max-connections.",
    ),
]
HeadTimeout = Annotated[
    float,
    typer.Option(
        "--head-timeout",
        min=0.1,
        help="Seconds a client has for its TLS handshake and a request's head; slower, it is cut.",
    ),
]
KeepaliveTimeout = Annotated[
    float,
    typer.Option(
        "--keepalive-timeout", min=0.1, help="Seconds an idle kept-alive connection stays open."
    ),
]
Metrics = Annotated[
    bool,
    typer.Option(
        "--metrics/--no-metrics",
        help="--no-metrics: hot paths record nothing; /metrics still answers with the figures "
        "read at scrape time.",
    ),
]


def _prefix(value: str) -> str:
    if (why := private_prefix_error(value)) is not None:
        raise typer.BadParameter(why)
    return value


PrivatePrefix = Annotated[
    str,
    typer.Option(help="The cluster's /48 of private addresses (a ULA prefix).", callback=_prefix),
]
MeshPort = Annotated[
    int | None,
    typer.Option(
        help="Join the private network's WireGuard mesh on this UDP port (docs/network.md)."
    ),
]
MeshEndpoint = Annotated[
    str | None, typer.Option(help="HOST:PORT other hosts reach --mesh-port at.")
]


def listener(
    max_connections: MaxConnections = _LIMITS.max_connections,
    max_connections_per_client: MaxPerClient = _LIMITS.max_per_client,
    head_timeout: HeadTimeout = _LIMITS.head_timeout,
    keepalive_timeout: KeepaliveTimeout = _LIMITS.keepalive_timeout,
) -> Limits:
    """The listener's options (`grouped(limits=listener)`): the `Limits` of every site the
    command serves."""
    return Limits(max_connections, max_connections_per_client, head_timeout, keepalive_timeout)


@dataclass(frozen=True)
class Logging:
    level: str
    format: str


def logging_options(log_level: LogLevel = "info", log_format: LogFormat = "text") -> Logging:
    """How the command logs (`grouped(logs=logging_options)`)."""
    return Logging(log_level, log_format)


@dataclass(frozen=True)
class Part:
    """What every long-running part (worker, broker, proxy) takes alike from its flags."""

    metrics: bool
    limits: Limits
    logs: Logging


@grouped(limits=listener, logs=logging_options)
def part_options(
    ctx: typer.Context,
    *,
    metrics: Metrics = True,
    limits: Limits,
    logs: Logging,
    config: Path | None = CONFIG,
    print_config: bool = PRINT_CONFIG,
) -> Part:
    """A part's shared options (`grouped(part=part_options)`); `--print-config` prints the
    settings in effect (`--config`'s file and the flags) and ends the command there."""
    if print_config:
        show_config(ctx)
        raise typer.Exit(0)
    return Part(metrics, limits, logs)


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise typer.BadParameter("use HOST:PORT, e.g. 127.0.0.1:7100")
    return host, int(port)


def log_to_stderr(
    level: str, fmt: str = "text", resource: str = "souk", kind: str = "process"
) -> None:
    """Every line names a resource: `resource` (this part, of `kind`) unless it names its own."""
    if fmt not in logsetup.FORMATS:
        raise typer.BadParameter(f"one of {', '.join(logsetup.FORMATS)}", param_hint="--log-format")
    logsetup.setup(level, fmt, resource, kind)  # type: ignore[arg-type]
    logging.getLogger("asyncio").addFilter(_not_the_ssl_eof_notice)


def _not_the_ssl_eof_notice(record: logging.LogRecord) -> bool:
    """asyncio (and uvloop) warn on every TLS connection a client closes first that aiohttp's
    protocol asks to stay half-open, which TLS cannot do: the connection closes as it should,
    and a warning per connection says nothing an operator can act on."""
    return not str(record.msg).startswith("returning true from eof_received()")


def refuse(part: str, message: str) -> NoReturn:
    """A part that cannot start says why in one line, no traceback, and exits 2: there is
    nothing to debug, only something on the host or the command line to change."""
    typer.echo(f"souk {part}: {message}", err=True)
    raise typer.Exit(2)


def check_homes_reachable(part: str, data_dir: Path, driver: str) -> None:
    """Refuse to start a root worker whose machines' users could not reach their homes below
    `data_dir` (each machine would fail to start instead, one at a time)."""
    if driver == "sim" or os.geteuid() != 0:
        return  # not root: machines run as the worker itself, which reaches its data dir
    closed = closed_above(data_dir)
    if closed is not None:
        refuse(
            part,
            f"machines run as their apps' own users, who cannot pass through {closed} (no"
            f" search permission for others) to reach their homes in {data_dir}: use a data dir"
            f" they can reach (e.g. under /var/lib/souk), or run `chmod o+x {closed}`",
        )


_CANNOT_LISTEN = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}


@contextmanager
def refusals(part: str) -> Iterator[None]:
    """Around a part's run: an address it cannot listen on (in use, not this host's, a
    privileged port) or a database from a newer souk (a binary rolled back under its data, which
    it then leaves untouched) ends it with one line, exit 2, not a traceback. (A program a part
    lacks, runc or losetup, is a capability it reports, not a reason not to start.)"""
    try:
        yield
    except SchemaTooNew as exc:
        refuse(part, str(exc))
    except OSError as exc:
        if exc.errno not in _CANNOT_LISTEN:
            raise
        refuse(part, f"cannot listen: {os.strerror(exc.errno).lower()}")


def secret_option(path: Path) -> bytes:
    """The cluster secret `--secret-file` names, or the reason it cannot be used, as a usage
    error on that option."""
    try:
        return read_secret(path)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--secret-file") from exc

"""What every long-running command (worker, broker, proxy, catalog, dev) shares: the address
it listens on, the limits of its listener (`souk.web.listener`), how it logs (`souk.logsetup`)
and how it refuses to start (one line, exit 2)."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer

from souk import logsetup
from souk.node.cluster_secret import read_secret
from souk.schema import SchemaTooNew
from souk.web.listener import DEFAULT_LIMITS as _LIMITS
from souk.web.listener import Limits
from souk.worker.machines.app_users import closed_above

LOG_LEVEL = typer.Option("info", "--log-level", help="debug, info, warning or error.")
LOG_FORMAT = typer.Option(
    "text",
    "--log-format",
    help="text, or json: one object per line, each with the resource it is about and its state.",
)
METRICS = typer.Option(
    True,
    "--metrics/--no-metrics",
    help="--no-metrics: hot paths record nothing; /metrics still answers with the figures read "
    "at scrape time.",
)


MAX_CONNECTIONS = typer.Option(
    _LIMITS.max_connections,
    "--max-connections",
    min=1,
    help="Connections open at once, at most; one more is closed as it comes.",
)
MAX_PER_CLIENT = typer.Option(
    _LIMITS.max_per_client,
    "--max-connections-per-client",
    min=1,
    help="Connections open at once from one address (IPv6: one /64); behind a load balancer "
    "or NAT, raise it to --max-connections.",
)
HEAD_TIMEOUT = typer.Option(
    _LIMITS.head_timeout,
    "--head-timeout",
    min=0.1,
    help="Seconds a client has for its TLS handshake and a request's head; slower, it is cut.",
)
KEEPALIVE_TIMEOUT = typer.Option(
    _LIMITS.keepalive_timeout,
    "--keepalive-timeout",
    min=0.1,
    help="Seconds an idle kept-alive connection stays open.",
)


def listener_limits(
    max_connections: int, per_client: int, head_timeout: float, keepalive_timeout: float
) -> Limits:
    """The four listener options as the `Limits` every site of the command gets."""
    return Limits(max_connections, per_client, head_timeout, keepalive_timeout)


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

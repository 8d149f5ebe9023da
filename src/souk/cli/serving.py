"""What every long-running command (worker, broker, proxy, catalog, dev) shares: the address
it listens on, how it logs (`souk.logsetup`) and how it refuses to start (one line, exit 2)."""

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
from souk.worker.app_users import closed_above

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
    privileged port) ends it with one line, exit 2, not a traceback. (A program a part lacks,
    runc or losetup, is a capability it reports, not a reason not to start.)"""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _CANNOT_LISTEN:
            raise
        refuse(part, f"cannot listen: {exc.strerror or exc}")

"""What every long-running command (worker, broker, proxy, catalog, dev) shares: the address
it listens on and how it logs."""

from __future__ import annotations

import logging

import typer

LOG_LEVEL = typer.Option("info", "--log-level", help="debug, info, warning or error.")


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise typer.BadParameter("use HOST:PORT, e.g. 127.0.0.1:7100")
    return host, int(port)


def log_to_stderr(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(name)s %(message)s")

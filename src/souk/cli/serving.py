"""What every long-running command (worker, broker, proxy, catalog, dev) shares: the address
it listens on, the limits of its listener (`souk.web.listener`) and how it logs
(`souk.logsetup`)."""

from __future__ import annotations

import typer

from souk import logsetup
from souk.web.listener import DEFAULT_LIMITS as _LIMITS
from souk.web.listener import Limits

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

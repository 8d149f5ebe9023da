"""What every long-running command (worker, broker, proxy, catalog, dev) shares: the address
it listens on and how it logs (`souk.logsetup`)."""

from __future__ import annotations

import typer

from souk import logsetup

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

"""How every long-running part logs: one line per event, each naming the resource it is about
and that resource's state, as text for people or JSON (`--log-format json`) for log shippers.

A line about a machine says so with `extra=about(machine_id, state)`; any other line is about
the part itself (`setup(..., resource="worker/w1")`), so no line lacks a resource. Imports
nothing of souk's: every part and the CLI use it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal, TextIO

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
NO_STATE = "-"
_OWN = {"resource", "kind", "state"}
# LogRecord's own attributes: anything else on a record came in `extra` and is shown.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def about(
    resource: str, state: str | None = None, kind: str = "machine", **fields: Any
) -> dict[str, Any]:
    """The `extra` of a log call about one resource: its id, its state (if known) and kind."""
    return {"resource": resource, "state": state or NO_STATE, "kind": kind, **fields}


class ResourceFilter(logging.Filter):
    """Gives a record that names no resource the part's own, so every line has one."""

    def __init__(self, resource: str, kind: str) -> None:
        super().__init__()
        self.resource = resource
        self.kind = kind

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "resource"):
            record.resource = self.resource
            record.kind = self.kind
        if not hasattr(record, "state"):
            record.state = NO_STATE
        if not hasattr(record, "kind"):
            record.kind = "machine"
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and k not in _OWN}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, resource, kind, state, message, any other
    `extra` fields, and the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "resource": getattr(record, "resource", None),
            "kind": getattr(record, "kind", None),
            "state": getattr(record, "state", NO_STATE),
            "msg": record.getMessage(),
        }
        line.update(_fields(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """`time logger kind/resource [state] message key=value...`"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(name)s %(kind)s/%(resource)s [%(state)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = _fields(record)
        if extra:
            head, sep, tail = text.partition("\n")
            pairs = " ".join(f"{k}={v}" for k, v in extra.items())
            text = f"{head} {pairs}{sep}{tail}"
        return text


def setup(
    level: str = "info",
    fmt: LogFormat = "text",
    resource: str = "souk",
    kind: str = "process",
    stream: TextIO | None = None,
) -> logging.Handler:
    """Root logging to `stream` (stderr) in `fmt`; returns the handler installed."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ResourceFilter(resource, kind))
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler

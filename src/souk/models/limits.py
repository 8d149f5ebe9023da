"""Bounds on what one machine's config can multiply: checks, processes, files, services, env...

Each bound is far above what a real machine needs (docs/api.md#limits has the table), and each
is checked where a request enters, on the broker and again on the worker: a config over one is
a 400 `limit_exceeded` naming the field and the limit. They are checked only when validating
with `INCOMING` as pydantic's context (what `souk.web.read_model` passes), so that a config a
worker stored before a bound existed still loads, and the machine can still be stopped,
updated or destroyed.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, TypeVar

from pydantic import AfterValidator, ValidationInfo
from pydantic_core import PydanticCustomError

LIMIT_EXCEEDED = "limit_exceeded"
INCOMING: dict[str, Any] = {"incoming": True}

MAX_CHECKS = 10  # a machine's checks, its own and its services' together
MIN_CHECK_INTERVAL = 1.0  # seconds between two probes of one check
MAX_CHECK_INTERVAL = 3600.0
MAX_CHECK_TIMEOUT = 60.0
MAX_CHECK_GRACE = 3600.0
MAX_CHECK_HEADERS = 32
MAX_CHECK_HEADER_BYTES = 16 << 10  # an http check's header names and values together
MAX_CHECK_PATH = 4096  # bytes of an http check's path
MAX_STOP_TIMEOUT = 300.0  # seconds between the stop signal and SIGKILL
MAX_PROCESSES = 32
MAX_FILES = 64
MAX_FILES_BYTES = 512 << 10  # every file's raw_value (base64 text) together
MAX_MOUNTS = 1  # one volume per machine, as Fly has it
MAX_SERVICES = 32
MAX_PORTS = 16  # per service
MAX_METADATA_ENTRIES = 256
MAX_ENV = 1024  # entries of one env (the machine's, or one process's)
MAX_ENV_FROM = 64
MAX_ARGS = 1024  # arguments of one exec, entrypoint or cmd
MAX_ARG_BYTES = 64 << 10  # one argument
MAX_STANDBYS = 64


def incoming(info: ValidationInfo) -> bool:
    """Whether this validation reads a request (bounds apply) rather than a stored row."""
    return bool(info.context and info.context.get("incoming"))


def exceeded(message: str, limit: float) -> PydanticCustomError:
    """The error a bound raises: the web layer answers its type with a 400 of that reason."""
    return PydanticCustomError(LIMIT_EXCEEDED, "{message}", {"message": message, "limit": limit})


def at_most(items: Sized | None, limit: int, unit: str) -> None:
    """`limit_exceeded` if `items` holds more than `limit`."""
    if items is not None and len(items) > limit:
        raise exceeded(f"at most {limit} {unit}; this is {len(items)}", limit)


S = TypeVar("S", bound=Sized | None)


def counted(items: S, info: ValidationInfo, limit: int, unit: str) -> S:
    """`items` as they are, checked by `at_most` when the validation reads a request: a field
    validator's whole body for a bounded list or map."""
    if incoming(info):
        at_most(items, limit, unit)
    return items


def bounded(limit: int, unit: str) -> AfterValidator:
    """A list's or map's bound as part of its field's type (`Annotated`): `counted`."""

    def check(items: S, info: ValidationInfo) -> S:
        return counted(items, info, limit, unit)

    return AfterValidator(check)


def in_range(seconds: float, low: float, high: float, what: str) -> None:
    """`limit_exceeded` unless `low <= seconds <= high`."""
    if not low <= seconds <= high:
        message = f"{what}: between {low:g} and {high:g} seconds; this is {seconds:g}"
        raise exceeded(message, high if seconds > high else low)


def argv_bounded(argv: list[str] | None) -> None:
    """One exec, entrypoint or cmd within `MAX_ARGS` arguments of `MAX_ARG_BYTES` each."""
    if argv is None:
        return
    at_most(argv, MAX_ARGS, "arguments")
    longest = max((len(a.encode()) for a in argv), default=0)
    if longest > MAX_ARG_BYTES:
        raise exceeded(
            f"an argument is at most {MAX_ARG_BYTES} bytes; this is {longest}", MAX_ARG_BYTES
        )

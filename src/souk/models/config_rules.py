"""The rules a machine's config is held to wherever it is checked: names, signals, the size of
its metadata, and how a field of Fly's that souk cannot honour is refused."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from souk.models import limits
from souk.models.limits import in_range, incoming

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_METADATA_BYTES = 64 << 10  # a machine's metadata, keys and values: it travels in every row
SIGNALS = {
    "SIGABRT",
    "SIGALRM",
    "SIGFPE",
    "SIGHUP",
    "SIGILL",
    "SIGINT",
    "SIGKILL",
    "SIGPIPE",
    "SIGQUIT",
    "SIGSEGV",
    "SIGTERM",
    "SIGTRAP",
    "SIGUSR1",
    "SIGUSR2",
}


def normalize_signal(value: str) -> str:
    """A signal's name as the drivers send it: `SIGTERM`, `TERM` and `sigterm` all name SIGTERM.

    Numbers are refused rather than mapped: they differ between architectures (SIGUSR1 is 10 on
    x86 and arm64, 30 on others), and Fly's API takes names."""
    name = value.upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    if name not in SIGNALS:
        hint = "; use a name, not a number" if value.strip().isdecimal() else ""
        raise ValueError(
            f"unknown signal {value[:32]!r}{hint}: one of {', '.join(sorted(SIGNALS))}"
        )
    return name


class MetadataTooLarge(ValueError):
    """A machine's metadata over `MAX_METADATA_BYTES`; an API answers it with a 413."""

    reason = "metadata_too_large"


def metadata_size(metadata: Mapping[str, str | None]) -> int:
    """Bytes of keys and values (UTF-8), as `check_metadata_size` counts them."""
    return sum(len(k.encode()) + len((v or "").encode()) for k, v in metadata.items())


def check_metadata_size(metadata: Mapping[str, str | None]) -> None:
    """The one limit on a machine's metadata, wherever it is set: a create, an update, or a
    patch once merged with what the machine already has."""
    if len(metadata) > limits.MAX_METADATA_ENTRIES:
        raise MetadataTooLarge(
            f"a machine's metadata has at most {limits.MAX_METADATA_ENTRIES} keys;"
            f" this has {len(metadata)}"
        )
    size = metadata_size(metadata)
    if size > MAX_METADATA_BYTES:
        raise MetadataTooLarge(
            f"a machine's metadata is at most {MAX_METADATA_BYTES >> 10} KiB of keys and values;"
            f" this is {size} bytes"
        )


def check_metadata_size_in_model(metadata: Mapping[str, str | None]) -> None:
    """`check_metadata_size` inside a model: an error type the web layer answers with a 413."""
    try:
        check_metadata_size(metadata)
    except MetadataTooLarge as exc:
        raise PydanticCustomError(MetadataTooLarge.reason, str(exc)) from None


def unsupported(why: str) -> PydanticCustomError:
    """A field of Fly's config that souk cannot honour: refused (400 `unsupported`, naming the
    field) rather than ignored, since ignoring it would change what the user gets."""
    return PydanticCustomError("unsupported", why)


def refused(reasons: dict[str, str]) -> Any:
    """One validator for a model's fields souk cannot honour, each with why: `unsupported` unless
    sent empty (`refuse_set`)."""

    def check(cls: type, value: Any, info: ValidationInfo) -> Any:
        return refuse_set(value, reasons[str(info.field_name)])

    return field_validator(*reasons)(classmethod(check))  # type: ignore[arg-type]


def refuse_set(value: Any, why: str) -> Any:
    """`value` if it is empty (as Fly's clients send unset fields), else `unsupported`."""
    if value in (None, False, 0, "", [], {}):
        return value
    raise unsupported(why)


def no_nul(argv: list[str] | None) -> list[str] | None:
    if argv and any("\0" in arg for arg in argv):
        raise ValueError("an argument cannot contain a NUL character")
    return argv


def check_env(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not ENV_NAME.match(name):
            raise ValueError(f"bad environment variable name {name!r}")
        if "\0" in env[name]:
            raise ValueError(f"environment variable {name} contains a NUL character")
    return env


def stop_timeout_bounded(seconds: float | None, info: ValidationInfo) -> None:
    """A stop waits at most `MAX_STOP_TIMEOUT` for the machine before killing it."""
    if seconds is not None and incoming(info):
        in_range(seconds, 0, limits.MAX_STOP_TIMEOUT, "timeout")

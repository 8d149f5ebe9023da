"""Durations as Fly writes them ("5s", "1m30s", "250ms") or as plain seconds."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_duration(value: Any) -> float:
    """Seconds, from seconds, a Go-style duration string or Fly's {"time.Duration": ns}."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '5s'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, dict) and isinstance(value.get("time.Duration"), int):
        seconds = value["time.Duration"] / 1e9
    elif isinstance(value, str):
        text = value.strip()
        pos, seconds = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text) or not text:
            raise ValueError(f"bad duration {value!r}: use e.g. '5s', '250ms', '1m'")
    else:
        raise ValueError("a duration is a number of seconds or a string like '5s'")
    if not math.isfinite(seconds):  # json reads Infinity and NaN; neither is a duration
        raise ValueError("a duration must be a finite number of seconds")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def format_duration(seconds: float) -> str:
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


# What the documents say: a string, as sent (and as Fly's API describes its durations); plain
# seconds and {"time.Duration": ns} are still read, for clients written against either.
DURATION_SCHEMA = {
    "type": "string",
    "pattern": r"^(\d+(\.\d+)?(ms|s|m|h))+$",
    "examples": ["5s", "250ms", "1m30s"],
}

Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema(DURATION_SCHEMA),
]

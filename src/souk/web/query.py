"""Numeric query parameters, declared once in the route table with their range and read through
`souk.web.routes.whole` or `number`, so that no value a client can write (huge, negative,
`nan`, not a number at all) gets past a 400 to an `int()`, a float comparison or SQLite."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from souk.web.errors import ApiError

_WHOLE = re.compile(r"^[+-]?[0-9]{1,40}\Z")
_DECIMAL = re.compile(
    r"^[+-]?(?:[0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})(?:[eE][+-]?[0-9]{1,3})?\Z"
)
SQLITE_MAX = (1 << 63) - 1  # the largest integer SQLite stores


@dataclass(frozen=True)
class Number:
    """A numeric query parameter in a route's `query`: what it is and the range it takes.
    `whole`: an integer (a count, a sequence number), else seconds and the like."""

    description: str
    low: float
    high: float
    whole: bool = True

    def schema(self) -> dict[str, object]:
        kind = "integer" if self.whole else "number"
        return {"type": kind, "minimum": self.low, "maximum": self.high}

    def parse(self, name: str, text: str) -> float:
        """The value of `text`, or a 400 `invalid` naming the parameter and its range."""
        pattern = _WHOLE if self.whole else _DECIMAL
        value = (int if self.whole else float)(text) if pattern.match(text) else None
        if value is None or not math.isfinite(value) or not self.low <= value <= self.high:
            kind = "a whole number" if self.whole else "a number"
            raise ApiError(
                400,
                "invalid",
                f"{name}: {kind} from {self.low:g} to {self.high:g}",
                {"parameter": name, "minimum": self.low, "maximum": self.high},
            )
        return value

"""The broker's domain refusals: a reason and why, no HTTP. The API's edge gives each reason its
status (`broker/api/errors.py`), as the worker's API does for the worker's errors."""

from __future__ import annotations

DECLINED = (
    "declined by the worker"  # a placement refusal: it fits by the numbers, yet the worker says no
)


class Refused(Exception):
    """Input the broker will not take: `code` is the machine-readable reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

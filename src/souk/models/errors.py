"""The one error body every souk HTTP API answers with."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorBody(BaseModel):
    """`status` is the machine-readable reason, as the Fly Machines API names it; `code` repeats it
    for the worker's internal API, whose clients predate the public one."""

    error: str
    status: str
    code: str
    details: dict[str, Any] | None = None

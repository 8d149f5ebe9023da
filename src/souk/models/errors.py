"""The one error body every souk HTTP API answers with."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorBody(BaseModel):
    """`code` is souk's machine-readable reason. `status` is the same on the worker's and the
    proxy's own APIs; on the broker's public API it is Fly's (`insufficient_capacity` or
    `unknown`), so that Fly's typed clients decode every error."""

    error: str
    status: str
    code: str
    details: dict[str, Any] | None = None

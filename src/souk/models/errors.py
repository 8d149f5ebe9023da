"""The one error body every souk HTTP API answers with, and the exception that carries one."""

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


class ErrorAnswer(Exception):
    """An error answer as an exception: its HTTP status and the fields of its `ErrorBody`. A
    server raises one to answer with it (`souk.web.ApiError`); a client raises one it was
    answered with (`souk.clients.http.ClientError`)."""

    def __init__(
        self, http_status: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.reason = reason
        self.message = message
        self.details = details

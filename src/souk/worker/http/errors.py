"""The one place a worker's refusal becomes an HTTP status."""

from __future__ import annotations

import functools

from aiohttp import web

from souk.web import ApiError
from souk.web.routes import Handler
from souk.worker.errors import (
    Conflict,
    InvalidImage,
    MetadataTooLarge,
    NoRoom,
    NotFound,
    RegistryUnavailable,
    StorageFault,
    StorageFull,
    TimedOut,
    WorkerError,
)

# The most specific class listed wins.
HTTP_STATUS: dict[type[WorkerError], int] = {
    InvalidImage: 400,
    NotFound: 404,
    Conflict: 409,
    TimedOut: 408,
    NoRoom: 412,
    MetadataTooLarge: 413,
    StorageFault: 503,
    StorageFull: 507,
    RegistryUnavailable: 502,
}
WRITE_ERRORS = (503, 507)  # any request that records something may meet a full disk


def http_error(exc: WorkerError) -> ApiError:
    status = next((HTTP_STATUS[c] for c in type(exc).__mro__ if c in HTTP_STATUS), 500)
    return ApiError(status, exc.reason, exc.message, exc.details)


def answering(handler: Handler) -> Handler:
    """The handler, its refusals answered through HTTP_STATUS."""

    @functools.wraps(handler)
    async def answer(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except WorkerError as exc:
            raise http_error(exc) from exc

    return answer

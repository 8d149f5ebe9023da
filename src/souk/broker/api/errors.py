"""A worker's error, stated once in the public API's terms for every handler."""

from __future__ import annotations

from aiohttp import web

from souk.clients.workers import WorkerError
from souk.web import ApiError
from souk.web.errors import Handler


def passthrough(exc: WorkerError) -> ApiError:
    """The worker's own status and reason (a 404, a 409 `lease_held`...) pass through as they
    are: the worker is the machine's writer and knows why. One it could not be asked is a 503."""
    if exc.http_status == 0:
        return ApiError(503, "worker_unreachable", str(exc))
    return ApiError(exc.http_status, exc.reason, exc.message, exc.details or None)


@web.middleware
async def worker_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except WorkerError as exc:
        raise passthrough(exc) from exc

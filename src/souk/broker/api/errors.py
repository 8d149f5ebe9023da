"""A worker's error, stated once in the public API's terms for every handler."""

from __future__ import annotations

import json

from aiohttp import web

from souk.broker.errors import Refused
from souk.clients.workers import WorkerCallError
from souk.web import ApiError
from souk.web.errors import Handler


def passthrough(exc: WorkerCallError) -> ApiError:
    """The worker's own status and reason (a 404, a 409 `lease_held`...) pass through as they
    are: the worker is the machine's writer and knows why. One it could not be asked is a 503."""
    if exc.http_status == 0:
        return ApiError(503, "worker_unreachable", str(exc))
    return ApiError(exc.http_status, exc.reason, exc.message, exc.details or None)


# Each reason of the broker's refusals (`souk.broker.errors.Refused`) and its status: the one
# place a domain refusal becomes HTTP.
REFUSAL_STATUS = {
    "invalid": 400,
    "unknown_secret": 400,
    "secret_too_large": 413,
    "metadata_too_large": 413,
    "too_many_secrets": 413,
    "sealed_unreadable": 500,  # the cluster's own keys, not the caller's input
}


def refusal(exc: Refused) -> ApiError:
    return ApiError(REFUSAL_STATUS.get(exc.code, 400), exc.code, exc.message)


@web.middleware
async def worker_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except WorkerCallError as exc:
        raise passthrough(exc) from exc


FLY_STATUSES = frozenset({"insufficient_capacity"})  # the spec's other value is "unknown"


@web.middleware
async def fly_statuses(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Error bodies as Fly's spec types them: `status` is `insufficient_capacity` or `unknown`;
    souk's own reason stays in `code` (the error shape's machine-readable field), so a typed Fly
    client decodes every error and souk's clients still tell reasons apart. Outermost: it sees
    every error body, whichever middleware or handler made it."""
    response = await handler(request)
    if response.status < 400 or not isinstance(response, web.Response):
        return response
    if response.content_type != "application/json" or not isinstance(response.body, bytes):
        return response
    try:
        body = json.loads(response.body)
    except ValueError:
        return response
    if isinstance(body, dict) and isinstance(body.get("status"), str):
        reason = body["status"]
        body["code"] = body.get("code") or reason
        body["status"] = reason if reason in FLY_STATUSES else "unknown"
        response.body = json.dumps(body).encode()
    return response

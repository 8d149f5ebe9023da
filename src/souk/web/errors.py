"""Every failure leaves as `{"error", "status", "code"}` with a proper 4xx/5xx, never a trace."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from souk.models.errors import ErrorAnswer, ErrorBody

log = logging.getLogger("souk.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATUS_REASONS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    414: "uri_too_long",
    409: "conflict",
    411: "length_required",
    412: "precondition_failed",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "too_many_requests",
    431: "headers_too_large",
    503: "unavailable",
}


class ApiError(ErrorAnswer):
    """Raised anywhere in a handler; `reason` is the machine-readable status."""


def error_body(reason: str, message: str, details: dict[str, Any] | None = None) -> ErrorBody:
    """What every error answer carries: `status` and `code` both the reason."""
    return ErrorBody(error=message, status=reason, code=reason, details=details)


def json_error(
    http_status: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> web.Response:
    body = error_body(reason, message, details)
    return web.json_response(body.model_dump(exclude_none=True), status=http_status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return json_error(exc.http_status, exc.reason, exc.message, exc.details)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_exception(request, exc)
    except ConnectionResetError:  # the client left (a stream it stopped reading): no one to answer
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_error(500, "internal_error", "internal error; see the server's log")


def _http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's own errors (no route, wrong method, body too large) in the JSON shape."""
    reason = _STATUS_REASONS.get(exc.status, "error")
    path = request.path[:200]
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = sorted(exc.allowed_methods)
        response = json_error(
            405,
            reason,
            f"{request.method} is not allowed on {path}; allowed: {', '.join(allowed)}",
            {"allowed": allowed},
        )
        response.headers["Allow"] = ", ".join(allowed)
        return response
    default = exc.text is None or exc.text == f"{exc.status}: {exc.reason}"
    if isinstance(exc, web.HTTPNotFound) and default:
        return json_error(404, reason, f"no such path: {path}")
    return json_error(exc.status, reason, exc.reason if exc.text is None else exc.text)

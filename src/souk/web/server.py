"""Serving an app so that even aiohttp's own early errors are in the JSON error shape.

A request aiohttp cannot parse (a header line over its limit, too many headers, a bad method or
Content-Length) never reaches the app or its middlewares: the protocol answers it itself, in
plain text that echoes part of the offending line, which may be a token. `JsonErrorRunner` gives
the protocol an error handler that answers like every other souk error instead: JSON, a
machine-readable reason, 431 for oversized headers, nothing of the request echoed.

aiohttp has no public hook for this, so the runner changes the class of the server it builds
(its only difference is the protocol it makes per connection); tests cover it against a real
server on loopback, so an aiohttp upgrade that moves the hook fails loudly.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import http_exceptions as hx
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from souk.web.errors import json_error

log = logging.getLogger("souk.web")


class JsonErrorProtocol(RequestHandler):
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp's: nothing can be sent any more
            raise ConnectionError("the response has started; no error can be sent")
        code, reason, text = self._describe(status, exc)
        if code >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
        else:
            log.debug("refused a malformed request from %s: %r", request.remote, exc)
        response = json_error(code, reason, text)
        response.force_close()
        return response

    def _describe(self, status: int, exc: BaseException | None) -> tuple[int, str, str]:
        """(status, reason, message): fixed texts, never a piece of the request."""
        if isinstance(exc, hx.LineTooLong):
            return (
                431,
                "headers_too_large",
                f"a header line is over {self.max_field_size} bytes, or the request line over"
                f" {self.max_line_size}",
            )
        if isinstance(exc, hx.BadHttpMessage) and exc.message.startswith("Too many headers"):
            return 431, "headers_too_large", f"more than {self.max_headers} header lines"
        if isinstance(exc, hx.BadHttpMethod):
            return 400, "bad_request", "malformed HTTP request: invalid method"
        if isinstance(exc, hx.InvalidURLError):
            return 400, "bad_request", "malformed HTTP request: invalid URL"
        if isinstance(exc, hx.PayloadEncodingError):
            return 400, "bad_request", "malformed HTTP request: invalid body encoding"
        if isinstance(exc, hx.HttpProcessingError) or 400 <= status < 500:
            return 400, "bad_request", "malformed HTTP request"
        if status == 504:
            return 504, "timeout", "the request timed out"
        return 500, "internal_error", "internal error; see the server's log"


class JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return JsonErrorProtocol(self, loop=self._loop, **self._kwargs)

    def connection(self, kind: type[JsonErrorProtocol], **options: Any) -> RequestHandler:
        """A protocol of `kind` (a subclass), with `options` over the runner's own."""
        return kind(self, loop=self._loop, **{**self._kwargs, **options})


class JsonErrorRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer unparseable requests in the JSON error shape."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = JsonErrorServer
        return server


def runner(app: web.Application) -> JsonErrorRunner:
    """How every souk server runs its app: JSON errors from the first byte, no access log."""
    return JsonErrorRunner(app, access_log=None)

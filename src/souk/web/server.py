"""Serving an app so that even aiohttp's own early errors are in the JSON error shape.

A request aiohttp cannot parse (a header line over its limit, too many headers, a bad method or
Content-Length) never reaches the app or its middlewares: the protocol answers it itself, in
plain text that echoes part of the offending line, which may be a token. `JsonErrorRunner` gives
the protocol an error handler that answers like every other souk error instead: JSON, a
machine-readable reason, 431 for oversized headers, nothing of the request echoed.

aiohttp has no public hook for this, so the runner changes the class of the server it builds
(its only difference is the protocol it makes per connection); tests cover it against a real
server on loopback, so an aiohttp upgrade that moves the hook fails loudly.

`HeadTimedProtocol` is the protocol every part's listener (`souk.web.listener`) makes: the same,
with a deadline for each request head, answered `408` in the same shape when it passes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import http_exceptions as hx
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from souk.web.errors import error_body, json_error

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


def timed_out_response() -> bytes:
    """The whole answer to a request head that came too slowly, in souk's error shape."""
    body = json.dumps(
        error_body("timeout", "the request head took too long").model_dump(exclude_none=True)
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


TIMED_OUT = timed_out_response()


class HeadTimedProtocol(JsonErrorProtocol):
    """A connection that must finish each request head in time (the first by `first_head_by`,
    each later one `head_timeout` after its first byte), and says when it closes. aiohttp has
    no hook for a head's progress: this reads its handler's `_waiter` (set while it waits for a
    request) and `_request_count` (heads parsed), and the tests time a slow head against a real
    part, so an upgrade that renames them fails loudly."""

    def __init__(
        self,
        server: web.Server,
        on_close: Callable[[], None],
        first_head_by: float,
        head_timeout: float,
        **kw: Any,
    ) -> None:
        super().__init__(server, **kw)
        self._on_close = on_close
        self._head_by = first_head_by
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._head_timer = self._loop.call_at(self._head_by, self._head_late)

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self._waiter is not None:
            # the first bytes of the next request on a kept-alive connection
            self._head_timer = self._loop.call_later(self._head_timeout, self._head_late)
        self._head_bytes = True
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
            self._head_bytes = False

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)
        self._on_close()

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport is None:
            return
        if self._head_bytes:
            self.transport.write(TIMED_OUT)
        log.debug("closed a connection whose request head was not done in time")
        self.force_close()

"""The plumbing every souk client shares, written once: a pooled aiohttp session made on first
use, JSON bodies written from the shared models, and answers that are not a success turned into
the boundary's own error, decoded from the shared error body."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from souk.models.errors import ErrorAnswer, ErrorBody

STREAM_CONNECT_TIMEOUT = 10.0  # a stream has no total timeout, only one to connect
# A TLS client keeps idle connections longer than aiohttp's 15 s: each new one costs a handshake.
TLS_KEEPALIVE = 60.0


class ClientError(ErrorAnswer):
    """The server refused (its HTTP status, reason and message), or did not answer in time or
    at all (`http_status` 0, reason `timeout` or `unreachable`). `details` is never None."""

    details: dict[str, Any]

    def __init__(
        self, http_status: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(http_status, reason, message, details or {})


E = TypeVar("E", bound=ClientError)
# How a boundary makes its error from a status, a reason, a message and details.
Failure = Callable[[int, str, str, dict[str, Any] | None], E]


def _refusal(payload: bytes) -> tuple[str, str, dict[str, Any] | None]:
    """The reason, message and details of an error answer. A body that is not souk's error body
    (a load balancer's page, say) is kept, shortened, as the message."""
    try:
        body = ErrorBody.model_validate_json(payload)
    except ValidationError:
        return "error", payload[:500].decode(errors="replace"), None
    return refusal_of(body)


def refusal_of(body: ErrorBody) -> tuple[str, str, dict[str, Any] | None]:
    """The reason, message and details of an error body."""
    return body.code or body.status, body.error, body.details  # code: souk's own reason


@dataclass(frozen=True)
class Tls:
    """How a client speaks TLS beyond the system's defaults.

    `trust`: the context of any request that names none (a private CA's, say). `identity`:
    called for each request of `send`/`stream`, the context holding the client's own
    certificate (a fresh one after a renewal on disk); each such request also names the server
    it means to reach. `only`: refuse plain-http URLs, so an address that says http:// cannot
    take a request around the checks."""

    trust: ssl.SSLContext | None = None
    identity: Callable[[], ssl.SSLContext] | None = None
    only: bool = False


class HttpClient:
    """One session for every call of a client, safe to share across tasks. Made on first use
    (inside the running loop) and remade once closed, unless the caller gave its own, which
    the caller closes. Connections are kept alive and reused: with TLS, a handshake is paid
    once per connection, not per request."""

    def __init__(
        self,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
        limit: int = 100,
        limit_per_host: int = 0,
        tls: Tls | None = None,
    ) -> None:
        self._session = session
        self._own = session is None
        self._headers = dict(headers or {})
        self._limits = (limit, limit_per_host)
        self.tls = tls or Tls()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or (self._own and self._session.closed):
            limit, per_host = self._limits
            tls = self.tls.trust is not None or self.tls.identity is not None
            connector = aiohttp.TCPConnector(
                limit=limit,
                limit_per_host=per_host,
                ttl_dns_cache=300,
                ssl=self.tls.trust if self.tls.trust is not None else True,
                keepalive_timeout=TLS_KEEPALIVE if tls else 15.0,
            )
            self._session = aiohttp.ClientSession(headers=self._headers, connector=connector)
        return self._session

    def _tls_args(self, fail: Failure[E], url: str, server_hostname: str | None) -> dict[str, Any]:
        """The TLS arguments of one request. aiohttp pools connections by server name and
        context too, so a connection verified for one name never carries another's request."""
        if self.tls.only and not url.startswith("https://"):
            message = f"refused to send to {url}: plain http, where TLS is required"
            raise fail(0, "untrusted", message, None)
        args: dict[str, Any] = {}
        if self.tls.identity is not None:
            args["ssl"] = self.tls.identity()
        if server_hostname is not None:
            args["server_hostname"] = server_hostname
        return args

    async def close(self) -> None:
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def send(
        self,
        fail: Failure[E],
        method: str,
        url: str,
        body: BaseModel | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        accept: Collection[int] = (),
        server_hostname: str | None = None,
    ) -> bytes:
        """The body of a success (a status below 400, or one in `accept`); else the boundary's
        error, made by `fail`. Over TLS, the server's certificate must carry `server_hostname`
        (default: the URL's host)."""
        data = body.model_dump_json(exclude_none=True).encode() if body is not None else None
        sent = dict(headers or {})
        if data is not None:
            sent["Content-Type"] = "application/json"
        tls = self._tls_args(fail, url, server_hostname)
        try:
            async with self.session.request(
                method,
                url,
                data=data,
                params=params,
                headers=sent,
                timeout=aiohttp.ClientTimeout(total=max(timeout, 0.001)),
                **tls,
            ) as resp:
                payload = await resp.read()
                status = resp.status
        except (TimeoutError, asyncio.TimeoutError):  # noqa: UP041
            raise fail(0, "timeout", f"no answer from {url} within {timeout:.3g}s", None) from None
        except aiohttp.ClientError as exc:
            raise _unreachable(fail, url, exc) from None
        if status >= 400 and status not in accept:
            raise fail(status, *_refusal(payload))
        return payload

    @contextlib.asynccontextmanager
    async def stream(
        self,
        fail: Failure[E],
        url: str,
        params: Mapping[str, str] | None = None,
        server_hostname: str | None = None,
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A GET's body as it arrives, for as long as the server sends it (logs that follow).
        An error answer is raised on entry, before any chunk."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=STREAM_CONNECT_TIMEOUT)
        tls = self._tls_args(fail, url, server_hostname)
        try:
            resp = await self.session.get(url, params=params, timeout=timeout, **tls)
        except aiohttp.ClientError as exc:
            raise _unreachable(fail, url, exc) from None
        try:
            if resp.status >= 400:
                raise fail(resp.status, *_refusal(await resp.read()))
            yield _chunks(resp, fail, url)
        finally:
            resp.release()


def _unreachable(fail: Failure[E], url: str, exc: Exception) -> E:
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        # Refused before a byte of the request left: nothing was sent there.
        why = getattr(exc.certificate_error, "verify_message", "") or str(exc.certificate_error)
        return fail(0, "untrusted", f"did not trust {url}: {why}", None)
    return fail(0, "unreachable", f"cannot reach {url}: {exc}", None)


async def _chunks(resp: aiohttp.ClientResponse, fail: Failure[E], url: str) -> AsyncIterator[bytes]:
    """Only reading is guarded: an error of the caller's own work between chunks stays its own."""
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    except aiohttp.ClientError as exc:
        raise _unreachable(fail, url, exc) from None

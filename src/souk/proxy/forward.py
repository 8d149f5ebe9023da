"""Forwarding one request: choose a machine (or start one), stream both ways, fail over.

Bodies are streamed in both directions, never buffered whole: the request body is pulled from
the client as the backend reads it, the response is written to the client as it arrives
(chunked responses stay chunked, lengths are kept). Compressed bodies pass through untouched.

Failover: a backend that refuses the connection (or times out connecting) has received nothing,
so the request goes to another machine whatever its method; a backend that fails after the
request began to be sent gets it again only for idempotent methods (GET, HEAD, OPTIONS, PUT,
DELETE, TRACE), and only if the request body was small enough to be held for a replay (64 KiB).
A response of known length up to 64 KiB is read whole before anything of it reaches the client,
so a backend that breaks it off (a machine stopped mid-answer, in a rolling deploy) counts as a
failed attempt, not a truncated answer; longer and streamed responses are relayed as they come,
and one broken off closes the client's connection, so that it sees the answer is incomplete.
A machine that refused a connection is out of rotation for a moment and its standby is started,
unless it was started only moments ago (an app still binding its port is not lost: the request
waits for its port instead, if nothing else can take it). A new connection that reaches a socket
its machine does not hold is closed unused (`souk.proxy.holders`): the request goes elsewhere,
or is answered 502 `foreign_listener`, and no start is tried for it.

Forwarding headers are the proxy's own: what a client sends as `X-Forwarded-*`, `Forwarded` or
`X-Real-IP` is dropped, and `force_https` asks only whether the client reached this proxy over TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from souk.clients.machines import MachinesApiError, MachinesClient
from souk.proxy.holders import TARGET, CheckedConnector, ForeignListener, Holders
from souk.proxy.routing import APP_HEADER, FAILED_FOR, Backend, Choice, Router
from souk.proxy.wake import Waker, port_open
from souk.web.errors import json_error
from souk.web.metrics import OFF, Off

log = logging.getLogger("souk.proxy.forward")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",  # answered here (100-continue) as the body is pulled
    }
)
# Headers through which a client could pass for a front proxy: dropped, and set anew from what
# this proxy saw (its peer, the Host it was sent, whether it was reached over TLS, its port).
FORWARDING = frozenset({"forwarded", "x-real-ip"})
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
REPLAY_LIMIT = 64 * 1024
HOLD_LIMIT = 64 * 1024  # responses of known length up to this are read whole, then sent
MAX_ATTEMPTS = 4
APP_CACHE_FOR = 5.0  # seconds an answer about an app's existence is reused
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 300.0  # seconds of silence from a backend before the request fails

# A machine just started may listen with a small backlog (Python's socketserver: 5): a burst of
# connections beyond it is dropped, and each dropped connect costs a 1 s SYN retransmit. Until it
# has answered WARM_AFTER requests, at most WARM_IN_FLIGHT wait on it for their answer at once.
WARM_IN_FLIGHT = 4
WARM_AFTER = 8
WARM_FOR = 30.0  # seconds after which a machine that never answered is no longer held back
MACHINE_HEADER = "souk-machine"
REGION_HEADER = "souk-region"


class RequestBody:
    """The client's body, pulled as a backend reads it; the first 64 KiB are held so that a
    request can be sent again after a failed attempt."""

    def __init__(self, request: web.Request, keep: int = REPLAY_LIMIT) -> None:
        self.request = request
        self.present = request.body_exists
        self.keep = keep
        self.held: list[bytes] = []
        self.size = 0
        self.pulled = False
        self.complete = False
        self.overflow = False

    def replayable(self) -> bool:
        return not self.present or not self.pulled or not self.overflow

    def stream(self) -> AsyncIterator[bytes] | None:
        return self._chunks() if self.present else None

    async def _chunks(self) -> AsyncIterator[bytes]:
        for chunk in list(self.held):
            yield chunk
        while not self.complete:
            chunk = await self.request.content.readany()
            if not chunk:
                self.complete = True
                return
            self.pulled = True
            if not self.overflow:
                self.size += len(chunk)
                if self.size > self.keep:
                    self.overflow = True
                    self.held.clear()
                else:
                    self.held.append(chunk)
            yield chunk


def end_to_end(
    headers: CIMultiDictProxy[str], dropped: Callable[[str], bool] = lambda _: False
) -> CIMultiDict[str]:
    """The headers meant for the far end of a hop: not the hop-by-hop ones, nor those its
    Connection header names, nor those `dropped` says of (by lower-case name)."""
    values = headers.getall("Connection", [])
    named = {token.strip().lower() for value in values for token in value.split(",")}
    kept: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        lower = key.lower()
        if lower in HOP_BY_HOP or lower in named or dropped(lower):
            continue
        kept.add(key, value)
    return kept


def _forwarding(lower: str) -> bool:
    """Said by the client of where it came from: said again by the proxy itself."""
    return lower in FORWARDING or lower.startswith("x-forwarded-")


def upstream_headers(request: web.Request) -> CIMultiDict[str]:
    headers = end_to_end(request.headers, _forwarding)
    headers["X-Forwarded-For"] = request.remote or ""
    headers["X-Forwarded-Host"] = request.host
    headers["X-Forwarded-Proto"] = request.scheme
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        headers["X-Forwarded-Port"] = str(sockname[1])
    return headers


def downstream_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    return end_to_end(upstream.headers)


def started_recently(updated_at: str, within: float) -> bool:
    try:
        when = datetime.fromisoformat(updated_at).timestamp()
    except ValueError:
        return False
    return time.time() - when < within


def make_session(holders: Holders | None = None) -> aiohttp.ClientSession:
    """Pooled keep-alive connections to backends; nothing decoded, no cookies kept. With
    `holders`, each new connection is checked to lead to its machine's own socket."""
    connector = (
        CheckedConnector(holders, limit=0, keepalive_timeout=4.0)
        if holders is not None
        else aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    )
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT
        ),
    )


class Warmup:
    """Machines this proxy just started, whose requests pass WARM_IN_FLIGHT at a time until
    they have been answered WARM_AFTER times."""

    def __init__(self) -> None:
        self._gates: dict[str, tuple[asyncio.Semaphore, list[int], float]] = {}

    def begin(self, machine_id: str) -> None:
        now = time.monotonic()
        if machine_id in self._gates:
            return
        for stale in [m for m, (_, _, t) in self._gates.items() if now - t > WARM_FOR]:
            del self._gates[stale]
        self._gates[machine_id] = (asyncio.Semaphore(WARM_IN_FLIGHT), [0], now)

    def warming(self, machine_id: str) -> bool:
        return machine_id in self._gates

    @contextlib.asynccontextmanager
    async def gate(self, machine_id: str) -> AsyncIterator[None]:
        """Around a request until its answer's headers arrive."""
        entry = self._gates.get(machine_id)
        if entry is None:
            yield
            return
        sem, answered, _ = entry
        async with sem:
            yield
        answered[0] += 1
        if answered[0] >= WARM_AFTER and self._gates.get(machine_id) is entry:
            del self._gates[machine_id]


class Forwarder:
    def __init__(
        self,
        router: Router,
        waker: Waker,
        broker: MachinesClient,
        session: aiohttp.ClientSession,
        domain: str,
        start_timeout: float,
    ) -> None:
        self.router = router
        self.waker = waker
        self.loads, self.marks = router.loads, router.marks  # one account of both, the router's
        self.broker = broker
        self.session = session
        self.domain = domain
        self.start_timeout = start_timeout
        self._apps: dict[str, tuple[bool, float]] = {}
        self.upstream_seconds: Off = OFF  # the proxy's histogram, once it has metrics
        self.warmup = Warmup()
        self.stats: dict[str, int] = {
            "requests": 0,
            "retries": 0,
            "connect_failures": 0,
            "no_machines": 0,
            "app_not_found": 0,
            "at_capacity": 0,
            "bad_gateway": 0,
            "foreign_listener": 0,
        }

    async def handle(self, request: web.Request, app: str) -> web.StreamResponse:
        self.stats["requests"] += 1
        body = RequestBody(request)
        deadline = time.monotonic() + self.start_timeout
        exclude: set[str] = set()
        fresh: list[Backend] = []  # refused, but started moments ago: maybe still binding
        foreign: ForeignListener | None = None  # its address was not its machine's
        idempotent = request.method in IDEMPOTENT
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                self.stats["retries"] += 1
            wake = not fresh and foreign is None  # a start would meet the same socket
            backend = await self._backend(app, frozenset(exclude), deadline, wake=wake)
            if isinstance(backend, web.Response):
                late = await self._late(fresh, deadline)
                if late is None:
                    return backend if foreign is None else _refused(foreign)
                fresh.remove(late)
                backend = late
            if (
                not attempt
                and _plain_http(request)
                and self.router.policies.of(backend.row).force_https
            ):
                self.loads.release(backend.id, app)
                return _to_https(request)
            outcome = await self._forward(request, body, backend, app)
            if isinstance(outcome, web.StreamResponse):
                return outcome
            exclude.add(backend.id)
            if isinstance(outcome, ForeignListener):  # nothing was sent: any method may go on
                self.stats["foreign_listener"] += 1
                self.marks.set("failed", backend.id, FAILED_FOR)
                foreign = outcome
                continue
            refused = outcome == "connect"
            if refused:
                self.stats["connect_failures"] += 1
                if started_recently(backend.row.updated_at, self.start_timeout):
                    fresh.append(backend)
                else:
                    self.marks.set("failed", backend.id, FAILED_FOR)
                    self.waker.lost(backend.row)
            if not body.replayable() or not (refused or idempotent):
                break
        if foreign is not None:
            return _refused(foreign)
        self.stats["bad_gateway"] += 1
        return json_error(502, "bad_gateway", f"no machine of {app} answered the request")

    async def _late(self, fresh: list[Backend], deadline: float) -> Backend | None:
        """The first of the just-started machines whose port accepts, with the request counted
        against it; None if none does in time."""
        if not fresh:
            return None
        polls = {asyncio.create_task(port_open(b.host, b.port, deadline)): b for b in fresh}
        try:
            pending = set(polls)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.result():
                        self.loads.acquire(polls[task].id)
                        self.warmup.begin(polls[task].id)
                        return polls[task]
            return None
        finally:
            for task in polls:
                task.cancel()

    async def _backend(
        self, app: str, exclude: frozenset[str], deadline: float, wake: bool = True
    ) -> Backend | web.Response:
        """A backend with the request counted against it, or the error answer. `wake`: False
        when a machine that just started is already there to wait for (another start would
        only take longer)."""
        while True:
            choice = self.router.choose(app, exclude)
            self._report_lost(choice)
            backend = choice.backend
            starting = backend is not None and backend.id in self.waker.starting
            if backend is not None and starting and self.waker.waking(app):
                # the catalog shows it started before its port accepts: follow the start
                self.loads.release(backend.id, app)
                woken = await self.waker.wake(app)
                if woken is not None and woken.id not in exclude:
                    self.loads.acquire(woken.id)
                    self.warmup.begin(woken.id)
                    return woken
                continue
            if backend is not None:
                if choice.over_soft:
                    self.waker.wake_soon(app)
                return backend
            if choice.serving == 0 and not await self._app_exists(app):
                self.stats["app_not_found"] += 1
                return json_error(404, "app_not_found", f"no app named {app!r}")
            if not wake:  # not counted: the caller waits for the machine that just started
                return json_error(
                    503, "no_machines", f"{app} has no machine that can take requests"
                )
            woken = await self.waker.wake(app)
            if woken is not None and woken.id not in exclude:
                self.loads.acquire(woken.id)
                self.warmup.begin(woken.id)
                return woken
            if choice.serving == 0 or time.monotonic() >= deadline:
                break
            try:  # everything is at its hard limit: wait for a request to end
                await asyncio.wait_for(
                    self.loads.freed(app).wait(), max(0.0, deadline - time.monotonic())
                )
            except TimeoutError:
                break
        if choice.serving:
            self.stats["at_capacity"] += 1
            return json_error(503, "at_capacity", f"every machine of {app} is at its hard limit")
        self.stats["no_machines"] += 1
        return json_error(503, "no_machines", f"{app} has no machine that can take requests")

    def _report_lost(self, choice: Choice) -> None:
        for row in choice.lost:
            self.waker.lost(row)

    async def _app_exists(self, app: str) -> bool:
        """From the catalog's app rows; an app it does not show yet (it may lag the registry by
        a moment) is asked of the broker, and the answer kept for a few seconds."""
        row = self.router.view.app(app)
        if row is not None:
            return not row.deleted
        if self.router.known(app):
            return True
        cached = self._apps.get(app)
        now = time.monotonic()
        if cached is not None and now - cached[1] < APP_CACHE_FOR:
            return cached[0]
        try:
            exists = await self.broker.app_exists(app)
        except MachinesApiError as exc:
            log.warning("could not ask the broker about %s: %s", app, exc)
            exists = True  # unsure: say "no machines" rather than "no such app"
        if len(self._apps) > 10_000:
            self._apps.clear()
        self._apps[app] = (exists, now)
        return exists

    async def _forward(
        self, request: web.Request, body: RequestBody, backend: Backend, app: str
    ) -> web.StreamResponse | str | ForeignListener:
        """The response, or why the attempt failed: "connect" (nothing was sent), "sent", or
        the refusal of a connection that did not lead to the machine (nothing was sent)."""
        began = time.perf_counter()
        target = TARGET.set(backend)
        try:
            try:
                async with self.warmup.gate(backend.id):
                    upstream = await self.session.request(
                        request.method,
                        backend.url + request.rel_url.raw_path_qs,
                        headers=upstream_headers(request),
                        data=body.stream(),
                        allow_redirects=False,
                        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
                    )
            except ForeignListener as exc:
                return exc
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                log.info("%s of %s refused a connection: %s", backend.id, app, exc)
                return "connect"
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.info("%s of %s failed the request: %s", backend.id, app, exc)
                return "sent"
            self.upstream_seconds.observe(time.perf_counter() - began)
            try:
                return await self._relay(request, upstream, backend)
            except (aiohttp.ClientError, TimeoutError) as exc:  # before a byte reached the client
                log.info("%s of %s broke off its response: %s", backend.id, app, exc)
                return "sent"
            finally:
                upstream.release()
        finally:
            TARGET.reset(target)
            self.loads.release(backend.id, app)

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, backend: Backend
    ) -> web.StreamResponse:
        """The response, streamed; or sent at once if it is short and of known length, read
        first (a backend failing that read raises: nothing has reached the client)."""
        bodiless = (
            request.method == "HEAD" or upstream.status in (204, 304) or upstream.status < 200
        )
        held = None
        length = upstream.content_length
        if not bodiless and length is not None and length <= HOLD_LIMIT:
            held = await upstream.read()
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(downstream_headers(upstream))
        response.headers[MACHINE_HEADER] = backend.id
        response.headers[REGION_HEADER] = backend.row.region
        await response.prepare(request)
        if bodiless or held is not None:
            await response.write_eof(held or b"")
            return response
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except ConnectionResetError:
            return response  # the client went away; closing the upstream response ends it
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("%s broke off its response: %s", backend.id, exc)
            if request.transport is not None:
                request.transport.close()  # the client must see the response is incomplete
            return response
        await response.write_eof()
        return response


def app_header(request: web.Request) -> str | None:
    return request.headers.get(APP_HEADER)


def _refused(foreign: ForeignListener) -> web.Response:
    return json_error(foreign.status, foreign.code, foreign.message)


def _plain_http(request: web.Request) -> bool:
    """Not over TLS here. What a client says of itself (`X-Forwarded-Proto`) is not asked: any
    client could say it."""
    return not request.secure


def _to_https(request: web.Request) -> web.Response:
    """A service port with `force_https`: plain HTTP is sent to the same URL over https, at the
    Host this proxy was sent (never one a header names)."""
    host = request.host
    return web.Response(
        status=301, headers={"Location": f"https://{host}{request.path_qs}"}, text="use https\n"
    )

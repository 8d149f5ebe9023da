"""Where every souk part accepts connections: bounded in number, in time, and in what they keep.

aiohttp's `TCPSite` accepts every connection it is offered, gives each a TLS state at once
(asyncio's holds a 256 KiB read buffer per connection), waits 60 s for a handshake and an hour
for a request. So `BoundedSite` accepts itself:

- at most `max_connections` open at once, and `max_per_client` from one address (one /64 for
  IPv6); one over is closed as soon as it is accepted;
- nothing is built for a connection until its client sends a byte: one that sends nothing
  costs a socket, and is closed `head_timeout` after it was accepted;
- the TLS handshake and the first request head must both be done `head_timeout` after the
  connection was accepted; each later head `head_timeout` after its first byte (else a 408, or
  nothing if nothing came); an idle kept-alive connection is closed after `keepalive_timeout`;
- after many connections have closed, their memory goes back to the system: what they leave
  in reference cycles is collected at once, not at the next collection of an idle part, and
  the C allocator is told to hand back its free pages (`malloc_trim`), which it does not do by
  itself for the many small blocks a connection frees.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import gc
import ipaddress
import json
import logging
import resource
import socket
import ssl
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from souk.web.errors import error_body
from souk.web.server import JsonErrorProtocol, JsonErrorServer

log = logging.getLogger("souk.web")

# Descriptors a part keeps for everything but its clients (databases, the bus, machines' pipes).
RESERVED_FILES = 256
# How far the open connections must fall from their peak for a reclaim to be worth its
# pause (a full collection): a flood going, not the churn of ordinary clients.
RECLAIM_DROP = 64
RECLAIM_DELAY = 1.0  # seconds after the close that crossed the mark: a wave is one reclaim
RECLAIM_EVERY = 10.0  # seconds between two reclaims at least
REFUSAL_LOG_EVERY = 10.0  # seconds between two warnings that connections are being refused
# accept() failures that pass: the system is out of descriptors or memory for a moment, or
# the client left before it was accepted.
TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}


@dataclass(frozen=True)
class Limits:
    """What one listener allows. `head_timeout` bounds a TLS handshake and a request head (a
    client on the far side of the world needs well under a second for both);
    `keepalive_timeout` is longer than any souk client keeps an idle connection (60 s), so a
    client never reuses one the server is closing."""

    max_connections: int = 1024
    max_per_client: int = 256
    head_timeout: float = 10.0
    keepalive_timeout: float = 75.0

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_client < 1:
            raise ValueError("connection limits must be at least 1")
        if self.head_timeout <= 0 or self.keepalive_timeout <= 0:
            raise ValueError("timeouts must be positive")


DEFAULT_LIMITS = Limits()


def client_of(address: Any) -> str:
    """Whom a peer address counts against: its IPv4 address, or its IPv6 /64 (the least one
    host is given), an IPv4-mapped IPv6 address as the IPv4 one."""
    host = address[0] if isinstance(address, tuple) else str(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


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


class Slot:
    """One admitted connection's place in its listener's counts; given back once."""

    __slots__ = ("_admission", "client")

    def __init__(self, admission: Admission, client: str) -> None:
        self.client = client
        self._admission: Admission | None = admission

    def release(self) -> None:
        admission, self._admission = self._admission, None
        if admission is not None:
            admission.left(self.client)


class Admission:
    """A listener's open connections, in all and per client."""

    def __init__(self, limits: Limits, on_change: Callable[[int], None]) -> None:
        self.limits = limits
        self.open = 0
        self.by_client: Counter[str] = Counter()
        self._on_change = on_change

    def admit(self, client: str) -> Slot | None:
        if self.open >= self.limits.max_connections:
            return None
        if self.by_client[client] >= self.limits.max_per_client:
            return None
        self.open += 1
        self.by_client[client] += 1
        self._on_change(self.open)
        return Slot(self, client)

    def left(self, client: str) -> None:
        self.open -= 1
        self.by_client[client] -= 1
        if not self.by_client[client]:
            del self.by_client[client]
        self._on_change(self.open)


def _trimmer() -> Callable[[], None]:
    """glibc's `malloc_trim(0)`: its free pages, wherever they are in the heap, back to the
    system. Nothing elsewhere (another C library frees as it goes, or keeps what it keeps)."""
    name = ctypes.util.find_library("c")
    lib = ctypes.CDLL(name) if name else None
    trim = getattr(lib, "malloc_trim", None)
    if trim is None:
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def run() -> None:
        trim(0)

    return run


malloc_trim = _trimmer()


class Reclaim:
    """Once the open connections have fallen `RECLAIM_DROP` below their peak: a collection (a
    closed connection's objects are left in reference cycles, which an idle part would not
    collect for hours), then `malloc_trim`. One per wave, `RECLAIM_DELAY` after the close that
    crossed the mark, and not more often than every `RECLAIM_EVERY` seconds."""

    def __init__(self) -> None:
        self.peak = 0
        self.runs = 0
        self._last = -RECLAIM_EVERY
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, open_now: int) -> None:
        self.peak = max(self.peak, open_now)
        if self._handle is None and self.peak - open_now >= RECLAIM_DROP:
            loop = asyncio.get_running_loop()
            at = max(loop.time() + RECLAIM_DELAY, self._last + RECLAIM_EVERY)
            self._handle = loop.call_at(at, self.run, loop)

    def run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = None
        self._last = loop.time()
        self.peak = 0  # from here on, the peak of what is open now or later
        self.runs += 1
        gc.collect()
        malloc_trim()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class HeadTimedProtocol(JsonErrorProtocol):
    """A connection that must finish each request head in time, and gives its slot back when
    it closes. aiohttp has no hook for a head's progress: this reads its handler's `_waiter`
    (set while it waits for a request) and `_request_count` (heads parsed), and the tests time a
    slow head against a real part, so an upgrade that renames them fails loudly."""

    def __init__(
        self, server: web.Server, slot: Slot, first_head_by: float, head_timeout: float, **kw: Any
    ) -> None:
        super().__init__(server, **kw)
        self._slot = slot
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
        self._slot.release()

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport is None:
            return
        if self._head_bytes:
            self.transport.write(TIMED_OUT)
        log.debug("closed a connection whose request head was not done in time")
        self.force_close()


def _listening_sockets(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Bound and listening, as `loop.create_server` binds: every address `host` names."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    made: list[socket.socket] = []
    seen: set[Any] = set()
    try:
        for family, kind, proto, _, address in infos:
            if address in seen:
                continue
            seen.add(address)
            sock = socket.socket(family, kind, proto)
            made.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            if port == 0:  # one port for all of them, as the first got
                port = sock.getsockname()[1]
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made


class _Listening(asyncio.AbstractServer):
    """What aiohttp's runner reads of a site's server: its sockets, and `close`."""

    def __init__(self, sockets: list[socket.socket]) -> None:
        self.sockets = sockets
        self._closed = False
        self._loop = asyncio.get_running_loop()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def start_serving(self) -> None:
        return None  # it serves from the start

    async def serve_forever(self) -> None:
        raise NotImplementedError("a BoundedSite serves until its runner is cleaned up")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for sock in self.sockets:
                sock.close()

    def is_serving(self) -> bool:
        return not self._closed

    async def wait_closed(self) -> None:
        return None


def effective_limits(limits: Limits) -> Limits:
    """`limits`, with at most as many connections as the open-file limit leaves room for."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or limits.max_connections <= soft - RESERVED_FILES:
        return limits
    room = max(soft - RESERVED_FILES, 1)
    log.warning(
        "at most %d connections, not %d: the open-file limit is %d (raise it with ulimit -n)",
        room,
        limits.max_connections,
        soft,
    )
    return Limits(
        room, min(limits.max_per_client, room), limits.head_timeout, limits.keepalive_timeout
    )


class BoundedSite(web.BaseSite):
    """A `web.TCPSite` within `Limits`; the runner must be `souk.web.runner`'s."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        limits: Limits = DEFAULT_LIMITS,
        backlog: int = 1024,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        if not isinstance(runner.server, JsonErrorServer):
            raise TypeError("a BoundedSite serves souk.web.runner's runners only")
        self._web: JsonErrorServer = runner.server
        self._host = host
        self._port = port
        self.limits = effective_limits(limits)
        self.reclaim = Reclaim()
        self.admission = Admission(self.limits, self.reclaim.watch)
        self._silent: set[_Silent] = set()  # accepted, not a byte from them yet
        self._handing: set[asyncio.Task[None]] = set()  # in their TLS handshake
        self._retry: asyncio.TimerHandle | None = None
        self._refusals_logged = -REFUSAL_LOG_EVERY

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host or '0.0.0.0'}:{self.port}"

    @property
    def port(self) -> int:
        if self._server is not None:
            return int(self._server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        return self._port

    @property
    def _sockets(self) -> list[socket.socket]:
        return self._server.sockets if self._server is not None else []  # type: ignore[attr-defined]

    async def start(self) -> None:
        await super().start()
        self._server = _Listening(_listening_sockets(self._host, self._port, self._backlog))
        self._watch()

    async def stop(self) -> None:
        """No more accepted, the listening sockets closed, then every connection not yet
        handed to aiohttp closed; the runner shuts down those it has."""
        self._unwatch()
        await super().stop()
        for silent in list(self._silent):
            silent.drop()
        for task in self._handing:
            task.cancel()
        await asyncio.gather(*self._handing, return_exceptions=True)
        self.reclaim.cancel()

    def _watch(self) -> None:
        self._retry = None
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)

    def _unwatch(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            if sock.fileno() >= 0:
                loop.remove_reader(sock.fileno())

    def _accept(self, listening: socket.socket) -> None:
        """Every connection waiting, as asyncio's own server accepts them (up to a backlog's
        worth per wake-up); each one over a limit closed at once."""
        loop = asyncio.get_running_loop()
        for _ in range(self._backlog):
            try:
                sock, address = listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in TRANSIENT:
                    raise
                log.warning("accepting connections failed: %s; again in 1 s", exc)
                self._unwatch()
                self._retry = loop.call_later(1.0, self._watch)
                return
            slot = self.admission.admit(client_of(address))
            if slot is None:
                sock.close()
                self._refused(loop.time())
                continue
            sock.setblocking(False)
            _Silent(self, sock, slot, loop.time() + self.limits.head_timeout).listen()

    def _refused(self, now: float) -> None:
        if now - self._refusals_logged >= REFUSAL_LOG_EVERY:
            self._refusals_logged = now
            log.warning(
                "refusing connections on %s: %d open (at most %d, %d per client)",
                self.name,
                self.admission.open,
                self.limits.max_connections,
                self.limits.max_per_client,
            )

    def hand_over(self, sock: socket.socket, slot: Slot, head_by: float) -> None:
        """A connection whose client has spoken, to aiohttp: after its TLS handshake, if any."""
        task = asyncio.get_running_loop().create_task(self._hand_over(sock, slot, head_by))
        self._handing.add(task)
        task.add_done_callback(self._handing.discard)

    async def _hand_over(self, sock: socket.socket, slot: Slot, head_by: float) -> None:
        loop = asyncio.get_running_loop()

        def protocol() -> RequestHandler:
            return self._web.connection(
                HeadTimedProtocol,
                slot=slot,
                first_head_by=head_by,
                head_timeout=self.limits.head_timeout,
                keepalive_timeout=self.limits.keepalive_timeout,
            )

        extra: dict[str, Any] = {}
        if self._ssl_context is not None:
            extra["ssl_handshake_timeout"] = max(head_by - loop.time(), 0.01)
        try:  # the transport owns the socket from here, and closes it on failure
            await loop.connect_accepted_socket(protocol, sock, ssl=self._ssl_context, **extra)
        except (OSError, ssl.SSLError) as exc:
            log.debug("dropped a connection in its TLS handshake: %r", exc)
            slot.release()
        except BaseException:
            slot.release()
            raise


class _Silent:
    """An accepted connection whose client has not said a word: a socket, a watch on it and
    a timer, nothing more. At its first byte it is handed over; at `head_by`, or if the client
    hangs up first, it is closed."""

    __slots__ = ("_head_by", "_site", "_slot", "_sock", "_timer")

    def __init__(self, site: BoundedSite, sock: socket.socket, slot: Slot, head_by: float) -> None:
        self._site = site
        self._sock = sock
        self._slot = slot
        self._head_by = head_by
        self._timer: asyncio.TimerHandle | None = None

    def listen(self) -> None:
        if self._settled():
            return
        loop = asyncio.get_running_loop()
        loop.add_reader(self._sock.fileno(), self._readable)
        self._timer = loop.call_at(self._head_by, self.drop)
        self._site._silent.add(self)

    def _settled(self) -> bool:
        """Handed over or dropped: True; still silent: False."""
        try:
            spoke = bool(self._sock.recv(1, socket.MSG_PEEK))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            spoke = False
        self._forget()
        if spoke:
            self._site.hand_over(self._sock, self._slot, self._head_by)
        else:
            self._close()
        return True

    def _readable(self) -> None:
        self._settled()

    def drop(self) -> None:
        self._forget()
        self._close()

    def _forget(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._site._silent.discard(self)

    def _close(self) -> None:
        self._sock.close()
        self._slot.release()

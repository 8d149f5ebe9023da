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
  nothing if nothing came: `souk.web.server.HeadTimedProtocol`); an idle kept-alive connection
  is closed after `keepalive_timeout`;
- after a wave of connections has closed, their memory goes back to the system
  (`souk.web.reclaim`).

The limits and the counts against them are `souk.web.limits`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from souk.web.limits import DEFAULT_LIMITS, Admission, Limits, Slot, client_of, effective_limits
from souk.web.reclaim import Reclaim
from souk.web.server import HeadTimedProtocol, JsonErrorServer

__all__ = ["DEFAULT_LIMITS", "BoundedSite", "Limits"]

log = logging.getLogger("souk.web")

REFUSAL_LOG_EVERY = 10.0  # seconds between two warnings that connections are being refused
# accept() failures that pass: the system is out of descriptors or memory for a moment, or
# the client left before it was accepted.
TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}


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
                on_close=slot.release,
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

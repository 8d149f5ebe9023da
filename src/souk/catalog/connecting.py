"""A bus that can be used at once while its connection is made in the background.

A node must serve before the bus is up: a worker, a broker or a replica started while NATS is
down opens its HTTP API at once and joins the catalog when NATS comes. Until then subscriptions
are remembered (and made on connecting), publishes are dropped and requests time out, which is
no worse than NATS core on a lost connection: the replication protocol repairs what was missed
by heartbeats and pulls. Once connected, the underlying bus reconnects by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Literal

from souk.catalog.bus import Bus, Handler, Subscription, authenticated

log = logging.getLogger("souk.catalog.bus")

SLOW = 2.0  # a connection not made by then is reported as not reachable (yet)
RETRY_FIRST = 0.25
RETRY_MAX = 5.0

LinkState = Literal["connecting", "connected", "disconnected"]


def link_state(bus: object) -> LinkState:
    """A bus's link as its client knows it: a `ConnectingBus` says; a NATS bus asks its client;
    an in-process bus is always connected."""
    state = getattr(bus, "state", None)
    if state in ("connecting", "connected", "disconnected"):
        return state  # type: ignore[no-any-return]
    nc = getattr(bus, "nc", None)
    down = nc is not None and not getattr(nc, "is_connected", True)
    return "disconnected" if down else "connected"


class _Later:
    """A subscription asked for before the connection: made on it once it is up."""

    def __init__(self, subject: str, handler: Handler) -> None:
        self.subject = subject
        self.handler = handler
        self.real: Subscription | None = None
        self.dropped = False

    async def attach(self, bus: Bus) -> None:
        if self.dropped:
            return
        self.real = await bus.subscribe(self.subject, self.handler)
        if self.dropped:  # unsubscribed while it was being made
            await self.real.unsubscribe()

    async def unsubscribe(self) -> None:
        self.dropped = True
        if self.real is not None:
            await self.real.unsubscribe()


class ConnectingBus:
    """`connect()` is retried (with a capped backoff) until it returns a bus; `on_connect`
    callbacks then run, e.g. an owner's first heartbeat or a replica's hello."""

    def __init__(self, connect: Callable[[], Awaitable[Bus]], where: str = "the bus") -> None:
        self._connect = connect
        self.where = where
        self.bus: Bus | None = None
        self.error: str | None = None  # why the last attempt failed, until one succeeds
        self._later: list[_Later] = []
        self._callbacks: list[Callable[[], Awaitable[None]]] = []
        self._up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def authenticated(self) -> bool:
        return self.bus is not None and authenticated(self.bus)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def on_connect(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._callbacks.append(callback)

    async def wait_connected(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._up.wait(), timeout)
        return self._up.is_set()

    @property
    def state(self) -> LinkState:
        if self.bus is None:
            return "connecting"
        nc = getattr(self.bus, "nc", None)  # NATS: its client knows whether the link is up now
        if nc is not None and not getattr(nc, "is_connected", True):
            return "disconnected"
        return "connected"

    async def _run(self) -> None:
        delay = RETRY_FIRST
        while True:
            attempt = asyncio.ensure_future(self._connect())
            try:
                done, _ = await asyncio.wait({attempt}, timeout=SLOW)
                if not done and self.error is None:
                    self.error = "not reachable yet"
                    log.warning("%s not reachable yet; connecting in the background", self.where)
                bus = await attempt
                break
            except asyncio.CancelledError:
                attempt.cancel()
                raise
            except Exception as exc:
                if self.error is None:
                    log.warning("%s not reachable yet (%s); retrying", self.where, exc)
                self.error = str(exc) or type(exc).__name__
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
        later, self._later = self._later, []
        self.bus, waited = bus, self.error is not None
        self.error = None
        for sub in later:
            await sub.attach(bus)
        self._up.set()
        (log.warning if waited else log.info)("connected to %s", self.where)
        for callback in self._callbacks:
            try:
                await callback()
            except Exception:
                log.exception("on connecting to %s", self.where)

    async def publish(self, subject: str, data: bytes, reply: str | None = None) -> None:
        if self.bus is not None:
            await self.bus.publish(subject, data, reply)

    async def subscribe(self, subject: str, handler: Handler) -> Subscription:
        if self.bus is not None:
            return await self.bus.subscribe(subject, handler)
        sub = _Later(subject, handler)
        self._later.append(sub)
        return sub

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        if self.bus is None:
            raise TimeoutError(f"{self.where} is not connected yet")
        return await self.bus.request(subject, data, timeout)

    def new_inbox(self) -> str:
        if self.bus is not None:
            return self.bus.new_inbox()
        return f"_INBOX.{secrets.token_hex(11)}"

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.bus is not None:
            await self.bus.close()

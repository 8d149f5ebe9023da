"""How catalog messages move: NATS core across processes and hosts, or an in-process bus.

Both give NATS core's guarantees and no more: at most once, in order per publisher and
subscription while nothing fails. The replication protocol is built to survive less (drops,
duplicates, reordering), which the in-process bus can inject on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("souk.catalog.bus")


@dataclass(frozen=True)
class Message:
    subject: str
    data: bytes
    reply: str | None = None


Handler = Callable[[Message], Awaitable[None]]


class Subscription(Protocol):
    async def unsubscribe(self) -> None: ...


def authenticated(bus: object) -> bool:
    """Whether the bus vouches for who published on an owner's subject: a NATS connection on
    the authenticated bus (mutual TLS to a server configured by `souk nats config`, whose
    subject permissions let only owner X publish under X's subjects), or a bus made so."""
    return bool(getattr(bus, "authenticated", False))


class Bus(Protocol):
    async def publish(self, subject: str, data: bytes, reply: str | None = None) -> None: ...

    async def subscribe(self, subject: str, handler: Handler) -> Subscription: ...

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        """One reply, or `TimeoutError`."""
        ...

    def new_inbox(self) -> str: ...

    async def close(self) -> None: ...


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` matches one token, a final `>` one or more."""
    ptoks, stoks = pattern.split("."), subject.split(".")
    for i, p in enumerate(ptoks):
        if p == ">":
            return len(stoks) > i
        if i >= len(stoks) or (p != "*" and p != stoks[i]):
            return False
    return len(ptoks) == len(stoks)


@dataclass
class Faults:
    """What the in-process bus does wrong, on purpose: each delivery is dropped, duplicated or
    delayed (so overtaken by later ones) with these probabilities; `down` drops everything."""

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    max_delay: float = 0.02
    down: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)


class _LocalSubscription:
    def __init__(self, bus: InProcessBus, pattern: str, handler: Handler) -> None:
        self.bus, self.pattern, self.handler = bus, pattern, handler
        self.queue: asyncio.Queue[Message] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            msg = await self.queue.get()
            try:
                await self.handler(msg)
            except Exception:  # one bad message must not stop the subscription
                log.exception("handler failed on %s", msg.subject)

    async def unsubscribe(self) -> None:
        if self in self.bus.subscriptions:
            self.bus.subscriptions.remove(self)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class InProcessBus:
    """The bus for one process (`souk dev`, unit tests): the same subjects and semantics as NATS
    core, delivered through per-subscription queues, with optional fault injection."""

    def __init__(self, faults: Faults | None = None, authenticated: bool = False) -> None:
        """`authenticated`: the bus stands for one whose permissions let an owner alone publish
        on its subjects (tests of what a replica then skips)."""
        self.faults = faults or Faults()
        self.authenticated = authenticated
        self.subscriptions: list[_LocalSubscription] = []
        self._inbox = itertools.count()
        self._delayed: set[asyncio.Task[None]] = set()
        self.published = 0
        self.bytes = 0

    async def publish(self, subject: str, data: bytes, reply: str | None = None) -> None:
        self.published += 1
        self.bytes += len(data)
        msg = Message(subject, data, reply)
        for sub in list(self.subscriptions):
            if subject_matches(sub.pattern, subject):
                self._deliver(sub, msg)

    def _deliver(self, sub: _LocalSubscription, msg: Message) -> None:
        f = self.faults
        if f.down or (f.drop and f.rng.random() < f.drop):
            return
        copies = 2 if f.duplicate and f.rng.random() < f.duplicate else 1
        for _ in range(copies):
            if f.reorder and f.rng.random() < f.reorder:
                task = asyncio.create_task(self._later(sub, msg, f.rng.random() * f.max_delay))
                self._delayed.add(task)
                task.add_done_callback(self._delayed.discard)
            else:
                sub.queue.put_nowait(msg)

    @staticmethod
    async def _later(sub: _LocalSubscription, msg: Message, delay: float) -> None:
        await asyncio.sleep(delay)
        sub.queue.put_nowait(msg)

    async def subscribe(self, subject: str, handler: Handler) -> Subscription:
        sub = _LocalSubscription(self, subject, handler)
        self.subscriptions.append(sub)
        return sub

    def new_inbox(self) -> str:
        return f"_INBOX.{next(self._inbox)}"

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        inbox = self.new_inbox()
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def on_reply(msg: Message) -> None:
            if not answer.done():
                answer.set_result(msg.data)

        sub = await self.subscribe(inbox, on_reply)
        try:
            await self.publish(subject, data, reply=inbox)
            return await asyncio.wait_for(answer, timeout)
        finally:
            await sub.unsubscribe()

    async def close(self) -> None:
        for sub in list(self.subscriptions):
            await sub.unsubscribe()
        for task in list(self._delayed):
            task.cancel()


class _NatsSubscription:
    def __init__(self, sub: Any) -> None:
        self.sub = sub

    async def unsubscribe(self) -> None:
        with contextlib.suppress(Exception):  # already gone with its connection
            await self.sub.unsubscribe()


class NatsBus:
    """NATS core through nats-py: reconnects forever, so a replica rides out a server restart
    (serving stale rows meanwhile) and repairs by pulling once it is back."""

    def __init__(self, nc: Any, authenticated: bool = False) -> None:
        self.nc = nc
        self.authenticated = authenticated

    @classmethod
    async def connect(
        cls,
        servers: str | list[str],
        name: str = "souk",
        tls: ssl.SSLContext | None = None,
        tls_hostname: str | None = None,
        inbox_prefix: str | None = None,
        authenticated: bool = False,
    ) -> NatsBus:
        """`tls`: mutual TLS to a server that maps client certificates to users (see
        `souk nats config`); `inbox_prefix`: where replies to this connection go, which such a
        server lets only this node read (`permissions.inbox_prefix`); `authenticated`: such a
        server's subject permissions are in force (`certs.bus_options` says so)."""
        import nats

        async def on_error(exc: Exception) -> None:
            log.debug("nats: %s", exc)

        if isinstance(servers, str):
            servers = [s.strip() for s in servers.split(",") if s.strip()]
        nc = await nats.connect(
            servers,
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            allow_reconnect=True,
            error_cb=on_error,
            connect_timeout=2,
            **({"tls": tls} if tls is not None else {}),
            **({"tls_hostname": tls_hostname} if tls_hostname else {}),
            **({"inbox_prefix": inbox_prefix} if inbox_prefix else {}),
        )
        return cls(nc, authenticated)

    async def publish(self, subject: str, data: bytes, reply: str | None = None) -> None:
        try:
            await self.nc.publish(subject, data, reply=reply or "")
        except Exception as exc:  # disconnected: heartbeats and pulls repair the gap later
            log.debug("publish on %s failed: %s", subject, exc)

    async def subscribe(self, subject: str, handler: Handler) -> Subscription:
        async def cb(msg: Any) -> None:
            try:
                await handler(Message(msg.subject, msg.data, msg.reply or None))
            except Exception:
                log.exception("handler failed on %s", msg.subject)

        return _NatsSubscription(await self.nc.subscribe(subject, cb=cb))

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        import nats.errors

        try:
            msg = await self.nc.request(subject, data, timeout=timeout)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            raise TimeoutError(str(exc)) from None
        except nats.errors.Error as exc:
            raise TimeoutError(f"nats: {exc}") from None
        return bytes(msg.data)

    def new_inbox(self) -> str:
        return str(self.nc.new_inbox())

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.drain()

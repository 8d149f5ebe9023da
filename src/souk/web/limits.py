"""What one listener allows (`Limits`, set by each part's flags), and its count of the
connections open, in all and per client address, against them."""

from __future__ import annotations

import ipaddress
import logging
import resource
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("souk.web")

# Descriptors a part keeps for everything but its clients (databases, the bus, machines' pipes).
RESERVED_FILES = 256


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

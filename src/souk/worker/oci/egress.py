"""Where the registry client may connect: public addresses, and the registries the worker lists.

An image reference names its registry, and a registry names more places (a token realm, a
redirect): left alone, whoever writes a machine's config could have the worker request its own
loopback services, its network's private hosts or the cloud's metadata address (169.254.169.254)
and read about them from the answer. So every connection of the client goes to a global address,
unless the host (`host`, or `host:port`) is one the operator listed (`--insecure-registry`,
`--private-registry`): a registry on loopback or in a private network is reached because it is
listed, and only that host and port.

Names are checked where they are resolved (`GuardedResolver`, the session's resolver), so a name
that resolves once to a public address and then to a private one is checked on the address
connected to; literal addresses, which aiohttp does not resolve, are checked on the URL (`check`).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

NAT64 = ipaddress.ip_network("64:ff9b::/96")


class EgressRefused(aiohttp.ClientConnectionError):
    """A connection to an address the worker does not reach for a registry."""


def public(address: str) -> bool:
    """Whether `address` is a global unicast address, also when it embeds an IPv4 address
    (mapped, NAT64, 6to4, Teredo) that is not."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_multicast or not ip.is_global:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = [ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None]
        if ip in NAT64:
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        return all(e is None or public(str(e)) for e in embedded)
    return True


class Egress:
    """The rule: `listed` hosts (`host` or `host:port`, as in image references) anywhere, every
    other host on public addresses only."""

    def __init__(self, listed: Iterable[str] = ()) -> None:
        self.listed = frozenset(h.lower() for h in listed)

    def is_listed(self, host: str, port: int | None) -> bool:
        host = host.lower()
        bare = host[1:-1] if host.startswith("[") else host
        names = {host, bare, f"{host}:{port}", f"[{bare}]:{port}"}
        return not self.listed.isdisjoint(names)

    def allows(self, host: str, port: int | None, address: str) -> bool:
        return public(address) or self.is_listed(host, port)

    def check(self, url: str | URL) -> None:
        """`EgressRefused` for a URL whose host is a literal address the rule refuses."""
        target = URL(url) if isinstance(url, str) else url
        host = target.raw_host or ""
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return  # a name: checked once resolved
        if not self.allows(host, target.port, host):
            raise EgressRefused(f"{host} is not a public address nor a listed registry")


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, keeping only the addresses `egress` allows for the host."""

    def __init__(self, egress: Egress, inner: AbstractResolver | None = None) -> None:
        self.egress = egress
        self.inner = inner or aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        kept = [r for r in found if self.egress.allows(host, port, r["host"])]
        if not kept:
            raise EgressRefused(f"{host} resolves to no public address and is not listed")
        return kept

    async def close(self) -> None:
        await self.inner.close()

"""`.internal` names, answered by each worker to its machines (docs/network.md, "Names").

Every machine's resolv.conf names its worker's resolver, `::3` of the cluster's /48 (an address
of the host's loopback, which every machine routes to). Its answers come from the catalog the
worker follows (a replica, `souk.catalog.view.CatalogView`), read at each query: a machine that
starts or is destroyed anywhere is in the answers as soon as the replica has its row, within
milliseconds. A machine sees the names of its own private network only (the network of the
address it asks from); the host itself sees every network's. Anything not under `.internal`
is passed to the host's own resolver and its answer returned as it came.

Wire format by dnslib. UDP and TCP on the same address and port, with the same answers: an
answer too long for the asker's datagram (512 bytes, or the size its EDNS offers) goes out
truncated (TC), and its library asks again over TCP, as glibc and musl do. What one machine can
make the resolver hold is bounded, as on every listener of souk: TCP connections in all and per
asking address (one over is closed at once), the wait for each question on one (an idle or
trickling connection is closed), and the questions forwarded upstream at once, in all and per
asker (one over gets no answer, as from a busy resolver)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dnslib import AAAA, QTYPE, RCODE, RR, TXT, DNSRecord
from dnslib.dns import DNSError

from souk.models.catalog import MachineRow
from souk.web.limits import Admission, Limits

log = logging.getLogger("souk.network.dns")

TTL = 5  # seconds: a machine's address changes only with the machine
UPSTREAM_TIMEOUT = 3.0
MAX_ANSWERS = 64
IPV6_FREEBIND = 78  # <linux/in6.h>: bind before the address is on the loopback
UDP_SIZE = 512  # bytes of an answer in a datagram, unless the question's EDNS offers more
EDNS_MAX = 1232  # bytes at most, whatever it offers: no fragments (DNS flag day 2020)


@dataclass(frozen=True)
class Bounds:
    """What the resolver holds for its askers at most (an asker is a machine's address)."""

    tcp_connections: int = 64
    tcp_per_asker: int = 4
    tcp_idle: float = 5.0  # seconds for the next whole question on a connection (RFC 7766)
    forwards: int = 256  # questions being asked upstream at once
    forwards_per_asker: int = 16


BOUNDS = Bounds()


class Machines(Protocol):
    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]: ...


def host_resolver(path: Path = Path("/etc/resolv.conf")) -> tuple[str, int] | None:
    """The host's first nameserver, where other names are asked."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            return (fields[1].split("%")[0], 53)
    return None


class Names:
    """What `.internal` names mean, read from the catalog at each question."""

    def __init__(self, view: Machines, region: str, cluster: str) -> None:
        self.view = view
        self.region = region
        self.cluster = ipaddress.IPv6Network(cluster)

    def network_of(self, address: str) -> ipaddress.IPv6Network | None:
        """The /72 a machine asks from; None for the host (or anything off the cluster)."""
        try:
            ip = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            return None
        if not isinstance(ip, ipaddress.IPv6Address) or ip not in self.cluster:
            return None
        return ipaddress.IPv6Network(f"{ip}/72", strict=False)

    def _started(
        self, network: ipaddress.IPv6Network | None, app: str | None = None
    ) -> list[MachineRow]:
        found = []
        for row in self.view.machines(app=app):
            if row.state != "started" or not row.private_ip or ":" not in row.private_ip:
                continue
            if network is not None and ipaddress.ip_address(row.private_ip) not in network:
                continue
            found.append(row)
        return found

    def addresses(self, name: str, asker: str) -> list[str] | None:
        """The AAAA answers for `name` (lower case, no trailing dot); None: no such name."""
        network = self.network_of(asker)
        labels = name.removesuffix(".internal").split(".")
        if not labels or not all(labels):
            return None
        app = labels[-1]
        rows = self._started(network, app)
        if len(labels) == 1:  # <app>.internal
            chosen = rows
        elif len(labels) == 2:  # <region>.<app>.internal
            chosen = [r for r in rows if r.region == labels[0]]
        elif len(labels) == 3 and labels[1] == "vm":  # <machine id>.vm.<app>.internal
            chosen = [r for r in rows if r.id == labels[0]]
        elif len(labels) == 4 and labels[1:3] == ["nearest", "of"] and labels[0][:3] == "top":
            try:  # top<N>.nearest.of.<app>.internal: this region first, then the others
                count = int(labels[0][3:])
            except ValueError:
                return None
            rows.sort(key=lambda r: (r.region != self.region, r.region, r.id))
            chosen = rows[: max(count, 0)]
        else:
            return None
        if not chosen and not self._known(network, app):
            return None
        return sorted(r.private_ip for r in chosen[:MAX_ANSWERS] if r.private_ip)

    def _known(self, network: ipaddress.IPv6Network | None, app: str) -> bool:
        """Whether the app has machines on the asker's network at all (started or not)."""
        for row in self.view.machines(app=app):
            ip = row.private_ip
            if ip and ":" in ip and (network is None or ipaddress.ip_address(ip) in network):
                return True
        return False

    def apps(self, asker: str) -> list[str]:
        """`_apps.internal`: the apps with started machines on the asker's network."""
        return sorted({r.app for r in self._started(self.network_of(asker))})

    def answer(self, query: DNSRecord, asker: str) -> DNSRecord:
        reply = query.reply()
        question = query.q
        name = str(question.qname).rstrip(".").lower()
        if name == "_apps.internal":
            if question.qtype in (QTYPE.TXT, QTYPE.ANY):
                text = ",".join(self.apps(asker))
                chunks = [text[i : i + 255] for i in range(0, len(text), 255)] or [""]
                reply.add_answer(RR(question.qname, QTYPE.TXT, rdata=TXT(chunks), ttl=TTL))
            return reply
        found = self.addresses(name, asker)
        if found is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif question.qtype in (QTYPE.AAAA, QTYPE.ANY):
            for address in found:
                reply.add_answer(RR(question.qname, QTYPE.AAAA, rdata=AAAA(address), ttl=TTL))
        return reply  # an A question of a name that exists: no addresses of that kind


def internal(query: DNSRecord) -> bool:
    return str(query.q.qname).rstrip(".").lower().endswith(".internal")


def room(query: DNSRecord) -> int:
    """How long a datagram answer to `query` may be: what its EDNS record offers, else 512."""
    for rr in query.ar:
        if rr.rtype == QTYPE.OPT:
            return max(UDP_SIZE, min(int(rr.rclass), EDNS_MAX))
    return UDP_SIZE


def failed(query: DNSRecord, rcode: int = RCODE.SERVFAIL) -> bytes:
    reply = query.reply()
    reply.header.rcode = rcode
    return bytes(reply.pack())


def counter(most: int, per_asker: int) -> Admission:
    """Counts of what askers hold, in all and per asker (their exact address: a machine's is
    its own, where a listener's /64 would lump a host's machines together)."""
    return Admission(Limits(max_connections=most, max_per_client=per_asker), lambda _: None)


class Resolver:
    """The worker's DNS: `.internal` from `names`, the rest from `upstream`, over UDP
    (`datagrams`) and TCP (`connection`)."""

    def __init__(
        self, names: Names, upstream: tuple[str, int] | None, bounds: Bounds = BOUNDS
    ) -> None:
        self.names = names
        self.upstream = upstream
        self.bounds = bounds
        self.forwards = counter(bounds.forwards, bounds.forwards_per_asker)
        self.connections = counter(bounds.tcp_connections, bounds.tcp_per_asker)
        self.writers: set[asyncio.StreamWriter] = set()

    async def resolve(self, data: bytes, query: DNSRecord, asker: str, tcp: bool) -> bytes | None:
        """The answer to `query` (its bytes `data`) as it goes back; None: none (too many of
        the asker's questions are upstream already)."""
        if internal(query):
            return self.local(query, asker, tcp)
        if self.upstream is None:
            return failed(query)
        slot = self.forwards.admit(asker)
        if slot is None:
            return None
        try:
            asking = ask_tcp if tcp else ask
            return await asyncio.wait_for(asking(self.upstream, data), UPSTREAM_TIMEOUT)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            return failed(query)
        finally:
            slot.release()

    def local(self, query: DNSRecord, asker: str, tcp: bool) -> bytes:
        """A `.internal` answer, from memory; truncated (TC, no records) for a datagram it
        does not fit."""
        answer = bytes(self.names.answer(query, asker).pack())
        if not tcp and len(answer) > room(query):
            truncated = query.reply()
            truncated.header.tc = 1
            return bytes(truncated.pack())
        return answer

    def datagrams(self) -> Datagrams:
        return Datagrams(self)

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One TCP connection: questions answered in turn (two-byte length, then the message),
        each to arrive whole within `tcp_idle`; closed at the first that does not, or that is
        not DNS, and at once if its asker holds its share of connections already."""
        asker = str(writer.get_extra_info("peername")[0]).split("%")[0]
        slot = self.connections.admit(asker)
        if slot is None:
            writer.transport.abort()
            return
        self.writers.add(writer)
        try:
            while True:
                try:
                    data = await asyncio.wait_for(message(reader), self.bounds.tcp_idle)
                    query = DNSRecord.parse(data)
                except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                    return
                except (DNSError, ValueError, IndexError):
                    return
                if not query.questions:
                    return
                answer = await self.resolve(data, query, asker, tcp=True)
                if answer is None:
                    return
                writer.write(len(answer).to_bytes(2, "big") + answer)
                await asyncio.wait_for(writer.drain(), self.bounds.tcp_idle)
        except (TimeoutError, ConnectionError):
            return
        finally:
            slot.release()
            self.writers.discard(writer)
            writer.transport.abort()


async def message(reader: asyncio.StreamReader) -> bytes:
    """One DNS message of a TCP stream (RFC 1035 4.2.2: its length first, two bytes)."""
    size = int.from_bytes(await reader.readexactly(2), "big")
    return await reader.readexactly(size)


class Datagrams(asyncio.DatagramProtocol):
    """The resolver over UDP: an answer a datagram each, forwarded questions as tasks."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self.transport: asyncio.DatagramTransport | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram one, by its endpoint

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        try:
            query = DNSRecord.parse(data)
        except (DNSError, ValueError, IndexError):
            return  # not a DNS question: no answer, as a resolver does
        if self.transport is None or not query.questions:
            return
        asker = str(addr[0]).split("%")[0]
        if internal(query):  # at once, from memory
            self.transport.sendto(self.resolver.local(query, asker, tcp=False), addr)
            return
        task = asyncio.ensure_future(self._forward(data, query, asker, addr))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _forward(
        self, data: bytes, query: DNSRecord, asker: str, addr: tuple[str | int, ...]
    ) -> None:
        answer = await self.resolver.resolve(data, query, asker, tcp=False)
        if answer is not None and self.transport is not None:
            self.transport.sendto(answer, addr)


async def ask(server: tuple[str, int], data: bytes) -> bytes:
    """One question to another resolver, its answer as it came."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[bytes] = loop.create_future()

    class One(asyncio.DatagramProtocol):
        def datagram_received(self, answer: bytes, addr: tuple[str | int, ...]) -> None:
            if not got.done():
                got.set_result(answer)

        def error_received(self, exc: Exception) -> None:
            if not got.done():
                got.set_exception(exc)

    transport, _ = await loop.create_datagram_endpoint(One, remote_addr=server)
    try:
        transport.sendto(data)
        return await got
    finally:
        transport.close()


async def ask_tcp(server: tuple[str, int], data: bytes) -> bytes:
    """One question to another resolver over TCP (asked so: an answer too long for a
    datagram), its answer as it came."""
    reader, writer = await asyncio.open_connection(*server)
    try:
        writer.write(len(data).to_bytes(2, "big") + data)
        await writer.drain()
        return await message(reader)
    finally:
        writer.transport.abort()


def _socket(kind: int, address: str, port: int) -> socket.socket:
    """Bound with SO_REUSEPORT (the several workers of one host share the port) and
    FREEBIND (before the address is on the loopback)."""
    sock = socket.socket(socket.AF_INET6, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FREEBIND, 1)
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


async def serve(
    names: Names,
    address: str,
    port: int = 53,
    upstream: tuple[str, int] | None = None,
    bounds: Bounds = BOUNDS,
) -> Callable[[], None]:
    """Answers on [address]:port, UDP and TCP; returns what closes both (and every open
    connection)."""
    resolver = Resolver(names, upstream, bounds)
    loop = asyncio.get_running_loop()
    udp = _socket(socket.SOCK_DGRAM, address, port)
    transport, _ = await loop.create_datagram_endpoint(resolver.datagrams, sock=udp)
    try:
        tcp = _socket(socket.SOCK_STREAM, address, udp.getsockname()[1])
        server = await asyncio.start_server(
            resolver.connection, sock=tcp, backlog=bounds.tcp_connections
        )
    except OSError:
        transport.close()
        raise
    log.info(
        "names: .internal answered on [%s]:%d (UDP, TCP), the rest asked of %s",
        address,
        port,
        upstream,
    )

    def close() -> None:
        transport.close()
        server.close()
        for writer in list(resolver.writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()

    return close

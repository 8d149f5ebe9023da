"""`.internal` names, answered by each worker to its machines (docs/network.md, "Names").

Every machine's resolv.conf names its worker's resolver, `::3` of the cluster's /48 (an address
of the host's loopback, which every machine routes to). Its answers come from the catalog the
worker follows (a replica, `souk.catalog.view.CatalogView`), read at each query: a machine that
starts or is destroyed anywhere is in the answers as soon as the replica has its row, within
milliseconds. A machine sees the names of its own private network only (the network of the
address it asks from); the host itself sees every network's. Anything not under `.internal`
is passed to the host's own resolver and its answer returned as it came.

Wire format by dnslib; the questions are small and one datagram each (UDP only: a TCP query
gets no answer, and the resolver's library retries over UDP as glibc and musl do)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from dnslib import AAAA, QTYPE, RCODE, RR, TXT, DNSRecord
from dnslib.dns import DNSError

from souk.models.catalog import MachineRow

log = logging.getLogger("souk.network.dns")

TTL = 5  # seconds: a machine's address changes only with the machine
UPSTREAM_TIMEOUT = 3.0
MAX_ANSWERS = 64
IPV6_FREEBIND = 78  # <linux/in6.h>: bind before the address is on the loopback


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


class Resolver(asyncio.DatagramProtocol):
    """The worker's DNS: `.internal` from `names`, the rest from `upstream`."""

    def __init__(self, names: Names, upstream: tuple[str, int] | None) -> None:
        self.names = names
        self.upstream = upstream
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
        if internal(query):
            self.transport.sendto(self.names.answer(query, str(addr[0])).pack(), addr)
            return
        task = asyncio.ensure_future(self._forward(data, query, addr))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _forward(self, data: bytes, query: DNSRecord, addr: tuple[str | int, ...]) -> None:
        answer: bytes
        if self.upstream is None:
            failed = query.reply()
            failed.header.rcode = RCODE.SERVFAIL
            answer = failed.pack()
        else:
            try:
                answer = await asyncio.wait_for(ask(self.upstream, data), UPSTREAM_TIMEOUT)
            except (OSError, TimeoutError):
                failed = query.reply()
                failed.header.rcode = RCODE.SERVFAIL
                answer = failed.pack()
        if self.transport is not None:
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


async def serve(
    names: Names, address: str, port: int = 53, upstream: tuple[str, int] | None = None
) -> Callable[[], None]:
    """Answers on [address]:port (SO_REUSEPORT: the several workers of one host share it);
    returns what closes it."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_FREEBIND, 1)
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: Resolver(names, upstream), sock=sock)
    log.info("names: .internal answered on [%s]:%d, the rest asked of %s", address, port, upstream)
    return transport.close

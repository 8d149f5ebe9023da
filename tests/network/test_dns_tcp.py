"""`.internal` over TCP (`souk.network.dns`): the same answers as over UDP, the whole of one too
long for a datagram (which says it is truncated), and what one asker can hold bounded: an idle
or trickling connection is closed, and connections over the caps are closed at once. The real
resolver on the loopback, asked with dnslib's client and plain sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from dnslib import QTYPE, DNSRecord

from souk.network.dns import Bounds, Names, serve
from souk.worker.machines.addresses import DEFAULT_PREFIX, worker_prefix
from tests.support.catalog_view import FakeView
from tests.support.ports import free_port

PREFIX = worker_prefix(DEFAULT_PREFIX, "personal/default", "w1")
MANY = 60  # machines of one app: 60 AAAA records are more than 512 bytes


def view() -> FakeView:
    rows = FakeView()
    rows.add("m0", app="alpha", ip=str(PREFIX[10]), worker="w1")
    for n in range(MANY):
        rows.add(f"b{n}", app="bulk", ip=str(PREFIX[100 + n]), worker="w1")
    return rows


Start = Callable[[Bounds], Awaitable[int]]


@pytest.fixture
async def resolver() -> AsyncIterator[Start]:
    """Starts the resolver on [::]:PORT (IPv6 and IPv4-mapped askers) with given bounds."""
    closing: list[Callable[[], None]] = []

    async def start(bounds: Bounds) -> int:
        port = free_port()
        names = Names(view(), "mad", DEFAULT_PREFIX)
        closing.append(await serve(names, "::", port, bounds=bounds))
        return port

    yield start
    for close in closing:
        close()


def asked(name: str, port: int, tcp: bool) -> DNSRecord:
    data = DNSRecord.question(name, "AAAA").send("::1", port, tcp=tcp, timeout=10, ipv6=True)
    return DNSRecord.parse(data)


async def test_a_tcp_question_gets_the_udp_answer(resolver: Start) -> None:
    port = await resolver(Bounds())
    over_udp = await asyncio.to_thread(asked, "alpha.internal", port, False)
    over_tcp = await asyncio.to_thread(asked, "alpha.internal", port, True)
    assert [str(rr.rdata) for rr in over_tcp.rr] == [str(PREFIX[10])]
    assert over_tcp.rr == over_udp.rr
    nx = await asyncio.to_thread(asked, "nothing.internal", port, True)
    assert nx.header.rcode == 3  # NXDOMAIN, over TCP too


async def test_an_answer_too_long_for_a_datagram_is_whole_over_tcp(resolver: Start) -> None:
    port = await resolver(Bounds())
    over_udp = await asyncio.to_thread(asked, "bulk.internal", port, False)
    assert over_udp.header.tc == 1 and not over_udp.rr  # asked again over TCP by its library
    over_tcp = await asyncio.to_thread(asked, "bulk.internal", port, True)
    assert over_tcp.header.tc == 0
    assert len([rr for rr in over_tcp.rr if rr.rtype == QTYPE.AAAA]) == MANY


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (EOF or reset) rather than keep it open; the
    wait is long enough for any load, and only a connection kept open reaches its end."""
    try:
        return await asyncio.wait_for(reader.read(1), 20) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def question(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> DNSRecord:
    data = DNSRecord.question("alpha.internal", "AAAA").pack()
    writer.write(len(data).to_bytes(2, "big") + data)
    size = int.from_bytes(await reader.readexactly(2), "big")
    return DNSRecord.parse(await reader.readexactly(size))


async def test_an_idle_or_trickling_connection_is_closed(resolver: Start) -> None:
    port = await resolver(Bounds(tcp_idle=0.2))
    idle = await asyncio.open_connection("::1", port)
    trickling = await asyncio.open_connection("::1", port)
    trickling[1].write(b"\x00")  # half of a length, and nothing more
    answered = await asyncio.open_connection("::1", port)
    assert (await question(*answered)).rr  # a connection that asks is answered
    assert await closed(idle[0])
    assert await closed(trickling[0])
    assert await closed(answered[0])  # and closed once it stops asking
    for _, writer in (idle, trickling, answered):
        writer.close()


async def test_connections_are_capped_per_asker_and_in_all(resolver: Start) -> None:
    port = await resolver(Bounds(tcp_connections=3, tcp_per_asker=2, tcp_idle=60))
    first = [await asyncio.open_connection("::1", port) for _ in range(2)]
    over_own_share = await asyncio.open_connection("::1", port)
    assert await closed(over_own_share[0])
    other = await asyncio.open_connection("127.0.0.1", port)  # another asker: room in all
    assert (await question(*other)).rr
    over_all = await asyncio.open_connection("127.0.0.1", port)
    assert await closed(over_all[0])
    for conn in first:  # those admitted are still answered
        assert (await question(*conn)).rr
    first[0][1].close()
    await first[0][1].wait_closed()
    for _ in range(100):  # a place given back is taken again, once the server has seen it go
        again = await asyncio.open_connection("::1", port)
        try:
            assert (await question(*again)).rr
            break
        except (asyncio.IncompleteReadError, ConnectionResetError):
            again[1].close()
            await asyncio.sleep(0.05)
    else:
        raise AssertionError("a connection's place was never given back")
    for _, writer in (*first[1:], over_own_share, other, over_all, again):
        writer.close()

"""The bus a worker starts with while NATS is not there yet: usable at once, connected later."""

from __future__ import annotations

import asyncio

import pytest

from souk.catalog.bus import Bus, InProcessBus, Message
from souk.catalog.connecting import ConnectingBus
from souk.worker.status import bus_status
from tests.support.waiting import eventually


async def test_what_is_asked_before_the_connection_holds_once_it_is_made() -> None:
    real = InProcessBus()
    attempts = 0
    release = asyncio.Event()

    async def connect() -> Bus:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise OSError("connection refused")
        await release.wait()
        return real

    bus = ConnectingBus(connect, "the test bus")
    got: list[bytes] = []

    async def on(msg: Message) -> None:
        got.append(msg.data)

    await bus.subscribe("a.kept", on)
    dropped = await bus.subscribe("a.dropped", on)
    await dropped.unsubscribe()
    await bus.publish("a.kept", b"while down")  # NATS core would drop it too
    with pytest.raises(TimeoutError):
        await bus.request("a.kept", b"", 1.0)
    hello: list[str] = []

    async def on_connect() -> None:
        hello.append(bus.state)

    bus.on_connect(on_connect)
    bus.start()
    await eventually(lambda: attempts == 3)
    assert (bus.state, bus_status(bus).connected) == ("connecting", False)
    assert bus.error == "connection refused"
    release.set()
    assert await bus.wait_connected(10)
    assert (bus.state, hello) == ("connected", ["connected"])
    assert bus.error is None
    assert bus_status(bus).connected

    await real.publish("a.kept", b"one")
    await real.publish("a.dropped", b"two")
    await bus.publish("a.kept", b"three")  # through the connection now
    await eventually(lambda: got == [b"one", b"three"])
    await bus.close()
    assert real.subscriptions == []


async def test_closing_before_any_connection_stops_trying() -> None:
    never = asyncio.Event()

    async def connect() -> Bus:
        await never.wait()
        raise AssertionError("unreachable")

    bus = ConnectingBus(connect)
    bus.start()
    assert not await bus.wait_connected(0.05)
    await bus.close()
    assert bus.state == "connecting"

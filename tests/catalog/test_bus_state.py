"""A replica says whether its own bus link is up: an operator (and the broker's placement) must
tell "the bus is down here" from "every worker went silent"."""

from __future__ import annotations

import asyncio

from souk.catalog.bus import Bus, InProcessBus
from souk.catalog.connecting import ConnectingBus
from souk.catalog.replica import Replica
from tests.support.waiting import eventually


async def test_the_status_names_the_bus_state_before_and_after_it_connects() -> None:
    real = InProcessBus()
    release = asyncio.Event()

    async def connect() -> Bus:
        await release.wait()
        return real

    bus = ConnectingBus(connect, "the test bus")
    replica = Replica(bus)
    await replica.start(bootstrap=False)  # serves at once, the bus still being connected
    bus.start()
    assert replica.status()["bus"] == "connecting"
    release.set()
    await eventually(lambda: replica.status()["bus"] == "connected")
    await replica.stop()
    await bus.close()


async def test_an_in_process_bus_is_always_connected() -> None:
    replica = Replica(InProcessBus())
    await replica.start(bootstrap=False)
    assert replica.status()["bus"] == "connected"
    await replica.stop()

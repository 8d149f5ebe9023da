"""A machine the proxy just started gets its requests a few at a time until it has answered
some: a burst beyond its listen backlog would lose connects to SYN retransmits."""

from __future__ import annotations

import asyncio

from souk.proxy.forward import WARM_AFTER, WARM_IN_FLIGHT, Warmup


async def test_a_warming_machine_takes_a_few_requests_at_a_time() -> None:
    warmup = Warmup()
    warmup.begin("m1")
    warmup.begin("m1")  # the waiters of one start all say so: still one gate
    inside, most = 0, 0

    async def request() -> None:
        nonlocal inside, most
        async with warmup.gate("m1"):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    await asyncio.gather(*(request() for _ in range(WARM_AFTER - 1)))
    assert most == WARM_IN_FLIGHT
    assert warmup.warming("m1")
    await request()  # the WARM_AFTER-th answer: warm now
    assert not warmup.warming("m1")
    most = 0
    await asyncio.gather(*(request() for _ in range(3 * WARM_IN_FLIGHT)))
    assert most == 3 * WARM_IN_FLIGHT


async def test_a_machine_not_started_by_the_proxy_is_not_held_back() -> None:
    warmup = Warmup()
    entered = 0

    async def request() -> None:
        nonlocal entered
        async with warmup.gate("m2"):
            entered += 1
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(request()) for _ in range(2 * WARM_IN_FLIGHT)]
    await asyncio.sleep(0.01)
    assert entered == 2 * WARM_IN_FLIGHT
    await asyncio.gather(*tasks)

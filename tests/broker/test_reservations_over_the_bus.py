"""Reservations carried on the bus (`souk broker --reserve-over-bus`): the worker answers them
with the code of its HTTP route, a refusal there sends the broker on to the next worker, and a
worker that does not answer on the bus is reserved over HTTP."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from souk.broker.placement.reservation import keyed_prefix, worker_tag
from souk.catalog.bus import InProcessBus, Message
from souk.clients.workers import WorkerCallError, WorkerClient
from souk.worker.machines.admission import Fences
from souk.worker.reserving import reserving
from tests.support.broker_cluster import SECRET, Cluster, ClusterFactory, WorkerSpec, machine_body


async def watching(bus: InProcessBus) -> list[str]:
    """The subjects of the reservations sent on the bus, as they are sent."""
    seen: list[str] = []

    async def keep(msg: Message) -> None:
        seen.append(msg.subject)

    await bus.subscribe("souk.reserve.>", keep)
    return seen


async def create(c: Cluster, path: str = "", **headers: str) -> Any:
    resp = await c.call(
        "POST", f"/v1/apps/demo/machines{path}", json=machine_body("mad"), headers=headers
    )
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_a_create_placed_over_the_bus_lands_on_its_worker(
    make_cluster: ClusterFactory,
) -> None:
    bus = InProcessBus()
    async with make_cluster([WorkerSpec("m1", "mad")], bus=bus, reserve_over_bus=True) as c:
        seen = await watching(bus)
        made = await create(c)
        assert made["worker"] == "m1"
        assert seen == ["souk.reserve.m1"]
        assert c.placer.reserver.bus_fallbacks == 0
        assert c.engines["m1"].get(made["id"]).config.guest.cpus == 1


async def test_a_worker_refusing_on_the_bus_sends_the_broker_to_the_next(
    make_cluster: ClusterFactory,
) -> None:
    """m1 (the emptier, so the first a spread placement asks) has fenced the id a keyed create
    would take there, so it refuses that create on the bus; m2 takes it."""
    bus = InProcessBus()
    specs = [WorkerSpec("m1", "mad", cpus=16, memory_mb=65536), WorkerSpec("m2", "mad")]
    async with make_cluster(specs, bus=bus, reserve_over_bus=True) as c:
        idem = hmac.new(SECRET, b"souk idempotency keys", hashlib.sha256).digest()
        prefix = keyed_prefix(idem, "demo", "deploy-1")
        fenced = prefix + worker_tag("m1")
        try:
            await WorkerClient().destroy("m1", c.urls["m1"], fenced, force=True, fence=True)
        except WorkerCallError as exc:
            assert exc.http_status == 404  # never made there, and now never will be
        seen = await watching(bus)
        made = await create(c, "?policy=spread", **{"Idempotency-Key": "deploy-1"})
        assert made["worker"] == "m2"
        assert made["id"] == prefix + worker_tag("m2")
        assert seen == ["souk.reserve.m1", "souk.reserve.m2"]
        assert c.placer.reserver.bus_fallbacks == 0
        assert c.engines["m1"].capacity().machines == 0


async def test_a_worker_not_answering_on_the_bus_is_reserved_over_http(
    make_cluster: ClusterFactory,
) -> None:
    bus = InProcessBus()
    async with make_cluster([WorkerSpec("m1", "mad")], bus=bus, reserve_over_bus=True) as c:
        # a secured worker on a bus that cannot say who published takes no reservation there
        async with reserving(c.engines["m1"], Fences(), bus, secure=True) as answering:
            assert not answering
        deaf = next(s for s in bus.subscriptions if s.pattern == "souk.reserve.m1")
        await deaf.unsubscribe()  # as that worker: nobody answers on its subject
        made = await create(c)
        assert made["worker"] == "m1"
        assert c.placer.reserver.bus_fallbacks == 1
        assert c.engines["m1"].capacity().machines == 1

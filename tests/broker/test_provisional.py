"""A broker's creates are provisional on their worker until the broker has answered its client:
it confirms them then, so they outlive their hold; a retried keyed create returns the same
machine and confirms it too."""

from __future__ import annotations

import asyncio

from souk.catalog.bus import InProcessBus
from tests.support.broker_cluster import Cluster, ClusterFactory, WorkerSpec, machine_body
from tests.support.waiting import eventually

PATH = "/v1/apps/demo/machines"
HOLD = 0.3


def hold_events(c: Cluster, machine_id: str) -> list[str]:
    return [
        f"{e.type}.{e.step}"
        for engine in c.engines.values()
        for e in (engine.events(machine_id) if engine.machines() else [])
        if e.type == "hold"
    ]


async def test_an_answered_create_is_confirmed_and_outlives_its_hold(
    make_cluster: ClusterFactory,
) -> None:
    async with make_cluster([WorkerSpec("m1", "mad")], bus=InProcessBus()) as c:
        c.placer.reserver.hold = HOLD
        resp = await c.call("POST", PATH, json=machine_body("mad"))
        assert resp.status == 200, await resp.text()
        machine = await resp.json()
        engine = c.engines["m1"]
        await eventually(lambda: engine.provisional_until(machine["id"]) is None)
        assert hold_events(c, machine["id"]) == ["hold.confirmed", "hold.provisional"]
        await asyncio.sleep(HOLD * 2)
        assert engine.get(machine["id"]).state == "started"
        assert c.placer.reserver.confirmations_pending == 0


async def test_a_keyed_retry_of_an_unconfirmed_create_returns_and_confirms_it(
    make_cluster: ClusterFactory,
) -> None:
    async with make_cluster([WorkerSpec("m1", "mad")], bus=InProcessBus()) as c:
        reserver, engine = c.placer.reserver, c.engines["m1"]
        reserver.hold = 30
        # the first try's broker dies after answering, before it confirms: nothing is sent
        confirm = reserver.confirm
        reserver.confirm = lambda *args: None  # type: ignore[method-assign]
        first = await resp_json(c, "k-lost")
        assert engine.provisional_until(first["id"]) is not None
        reserver.confirm = confirm  # type: ignore[method-assign]
        again = await resp_json(c, "k-lost")
        assert again["id"] == first["id"]
        await eventually(lambda: engine.provisional_until(first["id"]) is None)
        assert engine.capacity().machines == 1


async def resp_json(c: Cluster, key: str) -> dict[str, str]:
    resp = await c.call("POST", PATH, json=machine_body("mad"), headers={"Idempotency-Key": key})
    assert resp.status == 200, await resp.text()
    body: dict[str, str] = await resp.json()
    return body

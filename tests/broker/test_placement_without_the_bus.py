"""Placement when the bus says nothing: the broker's own link down, a worker silent on it, or a
worker whose HTTP calls fail. The broker reaches workers over HTTP, and places on evidence."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from souk.broker import liveness
from souk.broker.fleet import CatalogFleet
from souk.catalog.bus import Faults, InProcessBus
from souk.catalog.replica import Replica
from tests.support.broker_cluster import Cluster, ClusterFactory, WorkerSpec, machine_body

SILENT_AFTER = 0.05  # the replica's unreachable_after in these tests


class DownLink:
    up = False


def replica_of(c: Cluster) -> Replica:
    assert isinstance(c.fleet, CatalogFleet)
    assert isinstance(c.fleet.view, Replica)
    return c.fleet.view


async def create(c: Cluster, query: str = "", **body: object) -> tuple[int, Any]:
    path = "/v1/apps/demo/machines" + (f"?{query}" if query else "")
    resp = await c.call("POST", path, json={**machine_body("mad"), **body})
    return resp.status, await resp.json()


async def test_with_its_bus_link_down_the_broker_places_from_its_picture(
    make_cluster: ClusterFactory,
) -> None:
    faults = Faults()
    bus = InProcessBus(faults)
    async with make_cluster([WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad")], bus=bus) as c:
        status, body = await create(c)
        assert status == 200, body
        faults.down = True  # nothing travels on the bus: no heartbeat, no offer
        c.placer.link = DownLink()
        replica = replica_of(c)
        replica.unreachable_after = SILENT_AFTER
        await asyncio.sleep(SILENT_AFTER * 2)
        assert replica.workers("mad") == []  # the catalog hears nobody
        placed = set()
        for _ in range(4):
            status, body = await create(c, "policy=spread")
            assert status == 200, body
            placed.add(body["worker"])
        assert placed == {"m1", "m2"}
        rows, doubtful = c.placer.usable("mad")
        assert {r.id for r in rows} == doubtful == {"m1", "m2"}


async def test_a_worker_silent_on_the_bus_while_the_link_is_up_is_asked_directly(
    make_cluster: ClusterFactory,
) -> None:
    faults = Faults()
    bus = InProcessBus(faults)
    async with make_cluster([WorkerSpec("m1", "mad")], bus=bus) as c:
        status, body = await create(c)
        assert status == 200, body
        # the worker's heartbeats and offer answers no longer arrive; the broker's link is up
        faults.down = True
        replica = replica_of(c)
        replica.unreachable_after = SILENT_AFTER
        await asyncio.sleep(SILENT_AFTER * 2)
        assert c.placer.link is not None and c.placer.link.up
        assert c.placer.usable("mad")[1] == {"m1"}
        status, body = await create(c)
        assert status == 200, body
        assert body["worker"] == "m1"


async def test_a_worker_whose_call_failed_is_skipped_and_named_unreachable(
    make_cluster: ClusterFactory,
) -> None:
    bus = InProcessBus()
    async with make_cluster([WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad")], bus=bus) as c:
        c.placer.liveness.failed("m1")  # as after a reservation that got no answer
        # skipped slice by slice: the region's held rows are not copied to leave it out
        assert c.placer.usable("mad")[0] is c.fleet.placeable("mad")
        for _ in range(3):
            status, body = await create(c, "policy=binpack")
            assert status == 200, body
            assert body["worker"] == "m2"
        status, body = await create(c, avoid_workers=["m2"])
        assert status == 412, body
        assert {"worker": "m1", "reason": "unreachable"} in body["details"]["refusals"]
        c.placer.liveness.answered("m1")  # it answered another call: placeable again
        status, body = await create(c, avoid_workers=["m2"])
        assert status == 200, body
        assert body["worker"] == "m1"


async def test_the_picture_of_a_silent_worker_has_a_bounded_age(
    make_cluster: ClusterFactory,
) -> None:
    faults = Faults()
    bus = InProcessBus(faults)
    async with make_cluster([WorkerSpec("m1", "mad")], bus=bus) as c:
        replica = replica_of(c)
        replica.unreachable_after = SILENT_AFTER
        faults.down = True
        c.placer.link = DownLink()
        await asyncio.sleep(SILENT_AFTER * 2)
        assert c.placer.usable("mad")[1] == {"m1"}
        row = replica.workers("mad", reachable_only=False)[0]
        assert row.last_heartbeat is not None
        # as if the last heartbeat were older than the bound, with no HTTP answer since
        stale = row.model_copy(update={"last_heartbeat": row.last_heartbeat - 3600})
        assert not c.placer.liveness.fresh(stale)
        assert c.placer.liveness.fresh(row)


def test_a_shun_ends_with_its_time_and_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = liveness.Liveness()
    assert not seen.any_shunned
    seen.failed("m1")
    assert seen.any_shunned and seen.shunned("m1")
    monkeypatch.setattr(liveness, "SHUN_FOR", 0.0)  # its time is up
    assert not seen.shunned("m1")
    assert not seen.any_shunned  # forgotten: creates no longer look for shunned workers

"""The broker as it runs in a cluster: workers publish to the catalog and answer offers on the
bus; the broker places from its replica with one offer call per placement."""

from __future__ import annotations

import asyncio
import time

import pytest

from souk.broker.placement import pipeline
from souk.catalog.bus import InProcessBus
from souk.worker.state import queries
from souk.worker.state.store import Tx
from tests.support.broker_cluster import Cluster, ClusterFactory, WorkerSpec, machine_body


async def created(c: Cluster, body: dict[str, object]) -> dict[str, object]:
    resp = await c.call("POST", "/v1/apps/demo/machines", json=body)
    assert resp.status == 200, await resp.text()
    machine: dict[str, object] = await resp.json()
    return machine


async def listed(c: Cluster) -> set[str]:
    resp = await c.call("GET", "/v1/apps/demo/machines")
    return {m["id"] for m in await resp.json()}


async def eventually_listed(c: Cluster, ids: set[str]) -> None:
    deadline = time.monotonic() + 5
    while await listed(c) != ids:
        assert time.monotonic() < deadline, "the replica never caught up"
        await asyncio.sleep(0.01)


async def test_offers_over_the_bus_place_in_the_region(make_cluster: ClusterFactory) -> None:
    bus = InProcessBus()
    specs = [
        WorkerSpec("m1", "mad", cpus=2),
        WorkerSpec("m2", "mad", cpus=2),
        WorkerSpec("a1", "ams"),
    ]
    async with make_cluster(specs, bus=bus) as c:
        made = [await created(c, machine_body("mad")) for _ in range(4)]
        assert {m["region"] for m in made} == {"mad"}
        assert sorted(c.engines[w].capacity().machines for w in ("m1", "m2")) == [2, 2]
        await eventually_listed(c, {str(m["id"]) for m in made})
        resp = await c.call("POST", "/v1/apps/demo/machines", json=machine_body("mad"))
        assert resp.status == 412
        body = await resp.json()
        assert body["status"] == "insufficient_capacity"
        assert {r["worker"] for r in body["details"]["refusals"]} == {"m1", "m2"}


async def test_a_worker_that_does_not_answer_its_offer_call_is_asked_over_http(
    make_cluster: ClusterFactory,
) -> None:
    bus = InProcessBus()
    async with make_cluster([WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad")], bus=bus) as c:
        # one worker stops hearing offer calls (as while it reconnects); the catalog still
        # lists it, and the broker still reaches it directly
        deaf = next(s for s in bus.subscriptions if s.pattern == "souk.offers.mad")
        await deaf.unsubscribe()
        for _ in range(4):
            resp = await c.call(
                "POST", "/v1/apps/demo/machines?policy=spread", json=machine_body("mad")
            )
            assert resp.status == 200, await resp.text()
        counts = {w: c.engines[w].capacity().machines for w in ("m1", "m2")}
        assert sorted(counts.values()) == [2, 2]


async def test_auto_asks_for_offers_in_a_small_region_and_reads_the_catalog_in_a_big_one(
    make_cluster: ClusterFactory,
) -> None:
    bus = InProcessBus()
    async with make_cluster([WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad")], bus=bus) as c:
        taken: list[str] = []
        c.placer.on_decision = lambda strategy, _: taken.append(strategy)
        await created(c, machine_body("mad"))
        c.placer.offers_up_to = 1  # two eligible workers are now a big region
        # nobody answers offer calls any more: only a catalog placement can succeed
        for sub in [s for s in bus.subscriptions if s.pattern == "souk.offers.mad"]:
            await sub.unsubscribe()
        await created(c, machine_body("mad"))
        assert taken == ["offers", "catalog"]


async def test_a_big_region_is_ranked_a_slice_at_a_time_until_a_worker_takes_it(
    make_cluster: ClusterFactory,
) -> None:
    bus = InProcessBus()
    specs = [WorkerSpec(f"m{i}", "mad", cpus=1) for i in range(5)]
    async with make_cluster(specs, bus=bus) as c:
        c.placer.offers_up_to, c.placer.sample = 0, 2  # a "big" region, ranked two at a time
        made = [await created(c, machine_body("mad")) for _ in range(5)]
        assert sorted(str(m["worker"]) for m in made) == [s.name for s in specs]  # each found
        resp = await c.call("POST", "/v1/apps/demo/machines", json=machine_body("mad"))
        assert resp.status == 412
        refusals = (await resp.json())["details"]["refusals"]
        assert sorted({r["worker"] for r in refusals}) == [s.name for s in specs]  # all seen


async def test_a_create_naming_an_image_ranks_the_workers_holding_it_wherever_they_are(
    make_cluster: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big region is ranked a slice at a time, and the workers that hold the create's image
    join the first slice: found through the catalog's images, not by reading the region."""
    bus = InProcessBus()
    specs = [WorkerSpec(f"m{i}", "mad") for i in range(8)]
    image, digest = "registry.example/web:1", "sha256:" + "ab" * 32
    async with make_cluster(specs, bus=bus) as c:
        c.placer.offers_up_to, c.placer.sample = 0, 2  # a slice of two of eight workers

        def pulled(tx: Tx) -> None:  # what the worker logs when its cache has pulled one
            queries.insert_image(tx, digest, image, 1)
            tx.log("image", digest, "cache", "pulled", data={"ref": image})

        await c.engines["m6"].store.write(pulled)
        for _ in range(200):
            if c.placer.holding("mad", image):
                break
            await asyncio.sleep(0.01)
        assert [w.id for w in c.placer.holding("mad", image)] == ["m6"]
        pinned = f"{image}@{digest}"  # as a deploy sends it: found by its digest too
        assert [w.id for w in c.placer.holding("mad", pinned)] == ["m6"]
        assert c.placer.holding("mad", f"{image}@sha256:{'cd' * 32}") == []
        monkeypatch.setattr(pipeline, "STICKY_FOR", 0.0)  # a new slice each time: m6 rarely
        for _ in range(3):
            made = await created(c, machine_body("mad", image=image))
            assert made["worker"] == "m6"  # the image's holder, ranked first for its bonus

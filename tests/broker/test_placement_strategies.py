"""Placement through the broker against real workers: region, size, fullness, cordons, the
deadline, concurrency between two brokers, and every strategy."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.broker.api import machines
from souk.broker.fleet import StaticFleet
from souk.broker.placement.pipeline import Placer
from souk.broker.registry import AppRegistry
from souk.broker.server import make_app
from souk.broker.state import Broker
from souk.clients.workers import WorkerClient
from tests.support.broker_cluster import SECRET, Cluster, ClusterFactory, WorkerSpec, machine_body

M = "/v1/apps/demo/machines"
STRATEGIES = ["auto", "offers", "p2c", "catalog"]


async def place(c: Cluster, strategy: str, **kw: Any) -> Any:
    return await c.call("POST", M, params={"strategy": strategy}, json=machine_body(**kw))


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_region_and_size_are_honoured(make_cluster: ClusterFactory, strategy: str) -> None:
    specs = [
        WorkerSpec("small", "mad", cpus=2, memory_mb=1024),
        WorkerSpec("big", "mad", cpus=20, memory_mb=16384),
        WorkerSpec("elsewhere", "ams", cpus=64, memory_mb=65536),
    ]
    async with make_cluster(specs) as c:
        for _ in range(2):
            resp = await place(c, strategy, cpus=8, memory_mb=4096)
            assert resp.status == 200, await resp.text()
            machine = await resp.json()
            assert machine["worker"] == "big" and machine["region"] == "mad"
        for _ in range(2):  # mad can still take small guests, never in ams
            assert (await (await place(c, strategy, cpus=2, memory_mb=512)).json())["worker"] in (
                "small",
                "big",
            )
        resp = await place(c, strategy, cpus=8, memory_mb=4096)
        assert resp.status == 412
        body = await resp.json()
        assert body["status"] == "insufficient_capacity"
        assert body["details"]["region"] == "mad"
        assert {r["worker"] for r in body["details"]["refusals"]} == {"small", "big"}
        assert body["details"]["workers_asked"] == 2
        assert c.engines["elsewhere"].capacity().machines == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_fills_exactly_and_never_a_full_or_cordoned_worker(
    make_cluster: ClusterFactory, strategy: str
) -> None:
    specs = [WorkerSpec(f"w{i}", "mad", cpus=2, memory_mb=2048) for i in range(3)]
    async with make_cluster(specs) as c:
        await c.engines["w2"].set_cordoned(True)
        statuses = [(await place(c, strategy)).status for _ in range(6)]
        assert statuses == [200] * 4 + [412] * 2
        assert c.engines["w2"].capacity().machines == 0
        for name in ("w0", "w1"):
            cap = c.engines[name].capacity()
            assert cap.free.cpus == 0 and cap.machines == 2


async def test_a_broker_keeps_ranking_the_slice_that_had_room(make_cluster: ClusterFactory) -> None:
    """Creates rank the same slice of a region for a while: they fill its workers, then move on
    to the next slice with room, so the region fills a slice (two neighbouring workers here)
    at a time. A new random slice per create would scatter them over the region."""
    specs = [WorkerSpec(f"w{i}", "mad", cpus=2, memory_mb=2048) for i in range(6)]
    async with make_cluster(specs) as c:
        c.placer.offers_up_to, c.placer.sample = 0, 2
        order = []
        for _ in range(12):
            resp = await place(c, "catalog")
            assert resp.status == 200, await resp.text()
            order.append(int((await resp.json())["worker"][1:]))
        assert (await place(c, "catalog")).status == 412
        for i in range(0, 12, 4):  # four creates, two machines on each of a slice's workers
            a, b = sorted(set(order[i : i + 4]))
            assert b - a in (1, 5) and sorted(order[i : i + 4]) == [a, a, b, b], order


@pytest.mark.parametrize("strategy", ["catalog", "offers"])
async def test_a_deploys_creates_at_once_do_not_herd(
    make_cluster: ClusterFactory, strategy: str
) -> None:
    """Eight creates at once rank the same picture: without counting the creates already on
    their way to a worker against its room, all eight go to the best worker, which takes two
    and refuses six, and so on down the region (docs/study.md). Counted, each worker is sent
    what it has room for: eight reservations for eight machines, none refused."""
    specs = [WorkerSpec(f"w{i}", "mad", cpus=2, memory_mb=2048) for i in range(4)]
    async with make_cluster(specs) as c:
        c.placer.sample = 4
        resps = await asyncio.gather(*(place(c, strategy) for _ in range(8)))
        assert [r.status for r in resps] == [200] * 8
        assert all(c.engines[n].capacity().free.cpus == 0 for n in c.engines)
        read = c.placer.metrics.metrics.registry.get_sample_value
        assert read("souk_broker_reservation_creates_sum") == 8


async def test_a_412_names_the_first_refusals_and_counts_the_rest(
    make_cluster: ClusterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A region of thousands of workers would otherwise name every one of them in each 412,
    and a client asking for a size no worker has can ask again and again."""
    monkeypatch.setattr(machines, "MAX_REFUSALS_SHOWN", 2)
    specs = [WorkerSpec(f"w{i}", "mad", cpus=2, memory_mb=2048) for i in range(3)]
    async with make_cluster(specs) as c:
        resp = await place(c, "catalog", cpus=4)
        assert resp.status == 412
        details = (await resp.json())["details"]
        assert details["workers_asked"] == 3
        assert len(details["refusals"]) == 2 and details["refusals_omitted"] == 1
        assert all("not enough room" in r["reason"] for r in details["refusals"])
        read = c.placer.metrics.metrics.registry.get_sample_value
        assert read("souk_broker_no_capacity_refusals_total", {"reason": "room"}) == 3


async def test_a_region_with_no_room_answers_412_within_the_deadline(
    make_cluster: ClusterFactory,
) -> None:
    """One worker never answers (a listening socket nobody accepts on): the broker gives up on
    it after its offer timeout and still answers 412 with every worker's reason."""
    specs = [WorkerSpec("w0", "mad", cpus=1, memory_mb=512)]
    async with make_cluster(specs, deadline=1.0) as c:
        assert (await place(c, "offers")).status == 200
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(0)
            host, port = silent.getsockname()
            row = c.fleet.workers()[0].model_copy(
                update={"id": "silent", "address": f"http://{host}:{port}"}
            )
            assert isinstance(c.fleet, StaticFleet)
            c.fleet._workers["silent"] = row  # a worker the catalog still lists
            c.fleet._reachable.add("silent")
            c.fleet.addresses = [c.urls["w0"]]
            resp = await place(c, "offers")
        body = await resp.json()
        assert resp.status == 412, body
        reasons = {r["worker"]: r["reason"] for r in body["details"]["refusals"]}
        assert set(reasons) == {"w0", "silent"}
        assert "no offer" in reasons["silent"]


# Long enough that a loaded machine never turns "too slow" into "no room": the race is about
# room, and exactly the room there is must be placed.
RACE_DEADLINE = 30.0


@contextlib.asynccontextmanager
async def second_broker(c: Cluster, strategy_registry: AppRegistry) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    client = WorkerClient()
    fleet = StaticFleet(list(c.urls.values()), strategy_registry, client)
    await fleet.refresh()
    placer = Placer(fleet, client, deadline=RACE_DEADLINE)
    broker = Broker(fleet, client, placer, registry=strategy_registry)
    async with TestClient(TestServer(make_app(broker, SECRET), host="127.0.0.1")) as tc:
        yield tc


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_two_brokers_racing_never_overcommit_or_lose_a_machine(
    make_cluster: ClusterFactory, strategy: str, tmp_path: Any
) -> None:
    specs = [WorkerSpec(f"w{i}", "mad", cpus=4, memory_mb=4096) for i in range(3)]
    async with make_cluster(specs, deadline=RACE_DEADLINE) as c:
        registry = AppRegistry()
        registry.create("demo")
        async with second_broker(c, registry) as other:
            # neither broker refreshes its picture: both rank the same stale view
            async def one(client: TestClient) -> Any:  # type: ignore[type-arg]
                resp = await client.post(
                    M, params={"strategy": strategy}, json=machine_body(), headers=c.auth()
                )
                return resp.status, await resp.json()

            results = await asyncio.gather(*(one(c.broker if i % 2 else other) for i in range(20)))
        answered = [body for status, body in results if status == 200]
        assert len(answered) == 12  # exactly the room there is
        assert {status for status, _ in results} == {200, 412}
        on_workers = {m.id for e in c.engines.values() for m in e.machines()}
        assert {m["id"] for m in answered} == on_workers
        for engine in c.engines.values():
            cap = engine.capacity()
            assert cap.free.cpus >= 0 and cap.reserved.cpus == cap.machines


async def test_a_lease_taken_through_one_broker_holds_at_another(
    make_cluster: ClusterFactory,
) -> None:
    """Leases live on the machine's worker, so brokers that never talk agree on them."""
    async with make_cluster([WorkerSpec("w1", "mad")]) as c:
        registry = AppRegistry()
        registry.create("demo")
        created = await (await c.call("POST", M, json=machine_body())).json()
        mid = created["id"]
        lease = await (await c.call("POST", f"{M}/{mid}/lease", json={"ttl": 30})).json()
        async with second_broker(c, registry) as other:  # its picture includes the machine
            resp = await other.post(f"{M}/{mid}/stop", headers=c.auth())
            assert resp.status == 409 and (await resp.json())["code"] == "lease_held"
            held = {**c.auth(), "fly-machine-lease-nonce": lease["nonce"]}
            assert (await other.post(f"{M}/{mid}/stop", headers=held)).status == 200

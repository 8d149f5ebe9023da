"""Read-your-writes across brokers: a machine created through one broker is found through
another at once, though the other's catalog replica has not applied its row yet."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from aiohttp.test_utils import TestClient, TestServer

from souk.broker.fleet import CatalogFleet
from souk.broker.placement.pipeline import Placer
from souk.broker.placement.reservation import worker_tag
from souk.broker.server import make_app
from souk.broker.state import Broker
from souk.catalog.bus import InProcessBus
from souk.catalog.replica import Replica, following
from souk.clients.workers import WorkerClient
from tests.support.broker_cluster import SECRET, Cluster, ClusterFactory, WorkerSpec, machine_body
from tests.support.clients import Client


@contextlib.asynccontextmanager
async def second_broker(c: Cluster, bus: InProcessBus) -> AsyncIterator[tuple[Client, Replica]]:
    """Another broker on the same bus, with a replica of its own that stops applying anything
    once it knows the workers and the app: as one whose replica lags behind."""
    async with following(bus, bootstrap=False) as replica:
        deadline = time.monotonic() + 5
        while len(replica.workers()) < len(c.engines) or replica.app("demo") is None:
            assert time.monotonic() < deadline, "the second replica never learned the fleet"
            await asyncio.sleep(0.01)
        await pause(replica)
        fleet = CatalogFleet(replica, None)
        client = WorkerClient()
        broker = Broker(fleet, client, Placer(fleet, client, bus=bus))
        async with TestClient(TestServer(make_app(broker, SECRET), host="127.0.0.1")) as other:
            yield other, replica


async def pause(replica: Replica) -> None:
    for sub in replica._subs:
        await sub.unsubscribe()


async def test_a_machine_created_through_one_broker_is_found_through_another(
    make_cluster: ClusterFactory,
) -> None:
    bus = InProcessBus()
    async with (
        make_cluster([WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad")], bus=bus) as c,
        second_broker(c, bus) as (other, lagging),
    ):
        resp = await c.call("POST", "/v1/apps/demo/machines", json=machine_body("mad"))
        assert resp.status == 200, await resp.text()
        made = await resp.json()
        assert made["id"].endswith(worker_tag(made["worker"]))
        await asyncio.sleep(0.05)  # time enough for a replica that applies rows
        assert lagging.machine(made["id"]) is None
        auth = c.auth()
        path = f"/v1/apps/demo/machines/{made['id']}"
        resp = await other.get(path, headers=auth)
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["worker"] == made["worker"]
        resp = await other.post(f"{path}/stop", json={}, headers=auth)
        assert resp.status == 200, await resp.text()
        # an id nobody holds is still a 404, and another app's machine is not this app's
        resp = await other.get("/v1/apps/demo/machines/0000000000" + made["id"][-4:], headers=auth)
        assert resp.status == 404, await resp.text()
        resp = await c.call("POST", "/v1/apps", json={"name": "other"})
        assert resp.status == 201, await resp.text()
        resp = await other.get(f"/v1/apps/other/machines/{made['id']}", headers=auth)
        assert resp.status == 404, await resp.text()

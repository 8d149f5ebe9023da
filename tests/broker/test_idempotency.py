"""Creates with an `Idempotency-Key`: a retry returns the machine the first try made, through
any broker, and never a second one."""

from __future__ import annotations

from typing import Any

from souk.catalog.bus import InProcessBus
from tests.broker.test_read_your_writes import second_broker
from tests.support.broker_cluster import Cluster, ClusterFactory, WorkerSpec, machine_body

PATH = "/v1/apps/demo/machines"


async def keyed(c: Cluster, key: str, path: str = PATH) -> tuple[int, Any]:
    resp = await c.call("POST", path, json=machine_body("mad"), headers={"Idempotency-Key": key})
    return resp.status, await resp.json()


def held(c: Cluster) -> int:
    return sum(e.capacity().machines for e in c.engines.values())


async def test_a_retried_create_returns_the_same_machine(make_cluster: ClusterFactory) -> None:
    bus = InProcessBus()
    async with make_cluster([WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad")], bus=bus) as c:
        status, first = await keyed(c, "deploy-1/web-0")
        assert status == 200, first
        for _ in range(3):
            status, again = await keyed(c, "deploy-1/web-0")
            assert status == 200, again
            assert again["id"] == first["id"]
        assert held(c) == 1
        status, other = await keyed(c, "deploy-1/web-1")
        assert status == 200, other
        assert other["id"] != first["id"]
        resp = await c.call("POST", "/v1/apps", json={"name": "other"})
        assert resp.status == 201, await resp.text()
        status, elsewhere = await keyed(c, "deploy-1/web-0", "/v1/apps/other/machines")
        assert status == 200, elsewhere
        assert elsewhere["id"] != first["id"]
        assert held(c) == 3


async def test_a_retry_through_a_broker_that_has_not_seen_the_first_gets_it(
    make_cluster: ClusterFactory,
) -> None:
    bus = InProcessBus()
    async with (
        make_cluster([WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad")], bus=bus) as c,
        second_broker(c, bus) as (other, lagging),
    ):
        status, first = await keyed(c, "k-1")
        assert status == 200, first
        assert lagging.machine(first["id"]) is None
        headers = {**c.auth(), "Idempotency-Key": "k-1"}
        resp = await other.post(PATH, json=machine_body("mad"), headers=headers)
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["id"] == first["id"]
        assert held(c) == 1


async def test_a_bad_idempotency_key_is_refused(make_cluster: ClusterFactory) -> None:
    async with make_cluster([WorkerSpec("m1", "mad")], bus=InProcessBus()) as c:
        status, body = await keyed(c, "x" * 256)
        assert status == 400, body
        assert "Idempotency-Key" in body["error"]
        assert held(c) == 0

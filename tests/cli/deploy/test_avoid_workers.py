"""The create request's placement hint: `avoid_workers` keeps a machine off named workers (what a
deploy uses to put a standby on another worker than its primary)."""

from __future__ import annotations

from pathlib import Path

from tests.support.broker_cluster import WorkerSpec, cluster, machine_body

M = "/v1/apps/demo/machines"


async def test_avoided_workers_are_never_chosen(tmp_path: Path) -> None:
    specs = [WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad"), WorkerSpec("m3", "mad")]
    async with cluster(tmp_path, specs) as c:
        for strategy in ("offers", "p2c", "catalog", "offers"):  # m2 has room for four
            resp = await c.call(
                "POST",
                M,
                params={"strategy": strategy},
                json={**machine_body(), "avoid_workers": ["m1", "m3"]},
            )
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["worker"] == "m2"


async def test_nothing_left_is_a_412_naming_the_hint(tmp_path: Path) -> None:
    specs = [WorkerSpec("m1", "mad"), WorkerSpec("a1", "ams")]
    async with cluster(tmp_path, specs) as c:
        resp = await c.call("POST", M, json={**machine_body(), "avoid_workers": ["m1"]})
        assert resp.status == 412
        body = await resp.json()
        assert body["status"] == "insufficient_capacity"
        assert body["details"]["refusals"] == [
            {"worker": "m1", "reason": "avoided by the request (avoid_workers)"}
        ]
        resp = await c.call("POST", M, json={**machine_body(), "avoid_workers": "m1"})
        assert resp.status == 400
        assert (await resp.json())["error"].startswith("avoid_workers")

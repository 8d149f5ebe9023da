"""A volume extend while the machine mounting it is between states (a stop unmounting it) is a
409 naming the machine and its state, never a 500 that leaves the volume unmounted; once the
machine is stopped the extend goes through and the machine starts on the grown volume. Every
answer on the way holds no null (`attached_alloc_id` was one)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.fly_spec import no_nulls
from tests.support.broker_cluster import Cluster, WorkerSpec, cluster
from tests.support.volumes import sweep

A = "/v1/apps/demo"


@pytest.fixture
async def one(tmp_path: Path) -> AsyncIterator[Cluster]:
    try:
        async with cluster(tmp_path, [WorkerSpec("m1", "mad", disk_mb=64, driver="process")]) as c:
            yield c
    finally:
        sweep(tmp_path / "m1")


async def answer(resp: Any, status: int) -> Any:
    """The body, with no null in it (Fly leaves empty fields out)."""
    assert resp.status == status, await resp.text()
    body = await resp.json()
    no_nulls(body, str(resp.url))
    return body


async def test_an_extend_during_a_stop_is_a_409_and_after_it_goes_through(one: Cluster) -> None:
    c = one
    vol = await answer(
        await c.call("POST", f"{A}/volumes", json={"name": "d", "size_mb": 32, "region": "mad"}),
        200,
    )
    stubborn = ["sh", "-c", 'trap "" TERM INT; exec sleep 600']  # stops at its timeout only
    config = {
        "init": {"exec": stubborn},
        "mounts": [{"volume": vol["id"], "path": "/data"}],
        "stop_config": {"timeout": "3s"},
    }
    m = await answer(await c.call("POST", f"{A}/machines", json={"config": config}), 200)
    M = f"{A}/machines/{m['id']}"
    await answer(await c.call("GET", f"{M}/wait", params={"state": "started"}), 200)

    await answer(await c.call("POST", f"{M}/stop"), 200)
    busy = await answer(
        await c.call("PUT", f"{A}/volumes/{vol['id']}/extend", json={"size_mb": 48}), 409
    )
    assert busy["code"] == "volume_busy" and m["id"] in busy["error"], busy
    assert "stopping" in busy["error"]

    await answer(await c.call("GET", f"{M}/wait", params={"state": "stopped"}), 200)
    grown = await answer(
        await c.call("PUT", f"{A}/volumes/{vol['id']}/extend", json={"size_mb": 48}), 200
    )
    assert grown["volume"]["size_mb"] == 48
    await answer(await c.call("POST", f"{M}/start"), 200)
    await answer(await c.call("GET", f"{M}/wait", params={"state": "started"}), 200)
    await answer(await c.call("DELETE", M, params={"force": "true"}), 200)
    await answer(await c.call("GET", f"{M}/wait", params={"state": "destroyed"}), 200)

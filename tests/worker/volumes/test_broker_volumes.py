"""Volumes through the public API: placed by disk and kept apart, and machines that mount one
placed on its worker or nowhere, whichever broker is asked."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from typer.testing import CliRunner

from souk.broker.fleet import CatalogFleet, StaticFleet
from souk.broker.placement.pipeline import Placer
from souk.broker.registry import AppRegistry
from souk.broker.server import make_app as make_broker_app
from souk.broker.state import Broker
from souk.catalog.bus import InProcessBus
from souk.cli.main import app as cli
from souk.clients.workers import WorkerClient
from tests.support.broker_cluster import SECRET, Cluster, WorkerSpec, cluster, machine_body
from tests.support.clients import Client
from tests.support.volumes import sweep
from tests.support.waiting import eventually

V = "/v1/apps/demo/volumes"


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[Cluster]:
    """m1 and m2 offer 64 MB of disk each; m3 offers none."""
    specs = [
        WorkerSpec("m1", "mad", disk_mb=64),
        WorkerSpec("m2", "mad", disk_mb=64),
        WorkerSpec("m3", "mad"),
    ]
    try:
        async with cluster(tmp_path, specs) as c:
            yield c
    finally:
        for name in ("m1", "m2", "m3"):
            sweep(tmp_path / name)


@contextlib.asynccontextmanager
async def second_broker(c: Cluster, tmp_path: Path) -> AsyncIterator[Client]:
    """Another broker on the same workers, knowing nothing the first one did."""
    client = WorkerClient()
    registry = AppRegistry(tmp_path / "registry.db")
    fleet = StaticFleet(list(c.urls.values()), registry, client)
    await fleet.refresh()
    broker = Broker(fleet, client, Placer(fleet, client, deadline=2.0), registry=registry)
    async with TestClient(TestServer(make_broker_app(broker, SECRET, []), host="127.0.0.1")) as b:
        yield b
    await client.close()


async def answer(resp: Any, status: int) -> Any:
    assert resp.status == status, await resp.text()
    return await resp.json()


async def test_volumes_are_spread_and_refused_with_reasons(three: Cluster) -> None:
    body = {"name": "data", "size_mb": 32, "region": "mad"}
    first = await answer(await three.call("POST", V, json=body), 200)
    second = await answer(await three.call("POST", V, json=body), 200)
    assert {first["zone"], second["zone"]} == {"m1", "m2"}  # require_unique_zone: apart
    err = await answer(await three.call("POST", V, json=body), 412)
    reasons = {r["worker"]: r["reason"] for r in err["details"]["refusals"]}
    assert "--disk-mb" in reasons["m3"] and "another of the app's volumes" in reasons["m1"]
    # not apart, it fits next to one of them
    alongside = await answer(
        await three.call("POST", V, json={**body, "require_unique_zone": False}), 200
    )
    assert alongside["zone"] in ("m1", "m2")
    listed = await answer(await three.call("GET", V), 200)
    assert sorted(v["id"] for v in listed) == sorted([first["id"], second["id"], alongside["id"]])
    # another app sees none of them
    other = await three.call("GET", f"{V}/{first['id']}".replace("demo", "other"))
    assert other.status in (403, 404)
    await answer(await three.call("DELETE", f"{V}/{alongside['id']}"), 200)
    # snapshot, restore next to it (where the snapshot is), extend when there is room
    snap = await answer(await three.call("POST", f"{V}/{first['id']}/snapshots"), 200)
    snaps = await answer(await three.call("GET", f"{V}/{first['id']}/snapshots"), 200)
    assert [s["id"] for s in snaps] == [snap["id"]]
    restored = await answer(
        await three.call("POST", V, json={"name": "copy", "snapshot_id": snap["id"]}), 200
    )
    assert restored["zone"] == first["zone"] and restored["size_mb"] == 32
    extend = f"{V}/{first['id']}/extend"
    full = await answer(await three.call("PUT", extend, json={"size_mb": 40}), 412)
    assert full["details"] == {"disk_mb_free": 0, "asked_mb": 8}
    await answer(await three.call("DELETE", f"{V}/{restored['id']}"), 200)
    grown = await answer(await three.call("PUT", extend, json={"size_mb": 40}), 200)
    assert grown["volume"]["size_mb"] == 40 and grown["needs_restart"] is False
    await answer(await three.call("GET", f"{V}/{restored['id']}"), 404)


async def test_a_mount_places_on_the_volumes_worker_through_any_broker(
    three: Cluster, tmp_path: Path
) -> None:
    volume = await answer(
        await three.call("POST", V, json={"name": "data", "size_mb": 16, "region": "mad"}), 200
    )
    holder = volume["zone"]
    mounts = [{"volume": volume["id"], "path": "/data"}]
    async with second_broker(three, tmp_path) as other:
        headers = three.auth()
        resp = await other.post(
            "/v1/apps/demo/machines", json=machine_body(mounts=mounts), headers=headers
        )
        machine = await answer(resp, 200)
        assert machine["worker"] == holder
        # one machine at a time
        resp = await three.call("POST", "/v1/apps/demo/machines", json=machine_body(mounts=mounts))
        assert (await answer(resp, 409))["code"] == "volume_attached"
        resp = await three.call("DELETE", f"{V}/{volume['id']}")
        assert (await answer(resp, 409))["code"] == "volume_attached"
        await answer(
            await other.delete(
                f"/v1/apps/demo/machines/{machine['id']}?force=true", headers=headers
            ),
            200,
        )
        gone = f"/v1/apps/demo/machines/{machine['id']}/wait?state=destroyed&timeout=10"
        await answer(await three.call("GET", gone), 200)
        # the holder is full: the machine fails to place rather than going elsewhere
        filler = machine_body(cpus=4, memory_mb=1024)
        filler["avoid_workers"] = [w for w in ("m1", "m2", "m3") if w != holder]
        await answer(await three.call("POST", "/v1/apps/demo/machines", json=filler), 200)
        resp = await other.post(
            "/v1/apps/demo/machines", json=machine_body(mounts=mounts), headers=headers
        )
        err = await answer(resp, 412)
        assert [r["worker"] for r in err["details"]["refusals"]] == [holder]
        assert "volume's worker" in err["error"]
    nowhere = [{"volume": "vol_0000000000abcd", "path": "/data"}]
    resp = await three.call("POST", "/v1/apps/demo/machines", json=machine_body(mounts=nowhere))
    assert (await answer(resp, 412))["code"] == "volume_unavailable"


async def test_volumes_are_catalog_rows_owned_by_their_worker(tmp_path: Path) -> None:
    specs = [WorkerSpec("m1", "mad", disk_mb=64), WorkerSpec("m2", "mad", disk_mb=64)]
    try:
        async with cluster(tmp_path, specs, bus=InProcessBus()) as c:
            assert isinstance(c.fleet, CatalogFleet)
            await eventually(lambda: len(c.fleet.workers()) == 2)
            await eventually(lambda: all(w.disk_mb_total == 64 for w in c.fleet.workers()))
            body = {"name": "data", "size_mb": 16, "region": "mad"}
            made = await answer(await c.call("POST", V, json=body), 200)
            view = c.fleet.view
            await eventually(lambda: [v.id for v in view.volumes("demo")] == [made["id"]])
            row = view.volumes("demo")[0]
            assert (row.worker_id, row.size_mb, row.state) == (made["zone"], 16, "created")

            def reserved() -> int | None:
                holder = c.fleet.worker(made["zone"])
                return None if holder is None else holder.disk_mb_reserved

            await eventually(lambda: reserved() == 16)
            listed = await answer(await c.call("GET", V), 200)
            assert [v["id"] for v in listed] == [made["id"]]
            await answer(await c.call("DELETE", f"{V}/{made['id']}"), 200)
            await eventually(lambda: view.volumes("demo") == [])
    finally:
        for name in ("m1", "m2"):
            sweep(tmp_path / name)


async def test_souk_volumes_commands(three: Cluster) -> None:
    api = str(three.broker.make_url("")).rstrip("/")
    common = ["--api", api, "--token", three.tokens["admin"], "--json"]
    runner = CliRunner()

    async def souk(*args: str) -> Any:
        done = await asyncio.to_thread(runner.invoke, cli, ["volumes", *args, *common])
        assert done.exit_code == 0, done.output
        return json.loads(done.stdout)  # stderr may hold the in-process broker's logs

    made = await souk("create", "data", "--size-mb", "16", "-r", "mad")
    assert made["size_mb"] == 16 and made["state"] == "created"
    assert [v["id"] for v in await souk("list")] == [made["id"]]
    table = await asyncio.to_thread(
        runner.invoke, cli, ["volumes", "list", *common[:-1]], env={"COLUMNS": "60"}
    )
    assert made["id"] in table.stdout and "None" not in table.stdout, table.stdout  # unattached
    grown = await souk("extend", made["id"], "--size-mb", "24")
    assert grown["volume"]["size_mb"] == 24
    snaps = await souk("snapshots", made["id"], "--take")
    assert len(snaps) == 1 and snaps[0]["volume_size"] == 24 << 20
    assert (await souk("show", made["id"]))["bytes_total"] > 16 << 20
    assert (await souk("destroy", made["id"]))["state"] == "destroyed"
    refused = await asyncio.to_thread(runner.invoke, cli, ["volumes", "show", made["id"], *common])
    assert refused.exit_code != 0 and "not found" in refused.output

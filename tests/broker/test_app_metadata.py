"""App metadata: kept by the app registry, read and patched through any broker."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.broker.fleet import StaticFleet
from souk.broker.registry import MAX_KEYS, MAX_VALUE_BYTES, AppRegistry
from souk.broker.server import make_app as make_broker_app
from souk.broker.state import Broker
from souk.clients.workers import WorkerClient
from souk.models.secrets import SecretRecord
from tests.support.broker_cluster import SECRET, Cluster, ClusterFactory, WorkerSpec

META = "/v1/apps/demo/metadata"
RELEASE = json.dumps({"version": 7, "image": "registry.example/demo:7", "strategy": "rolling"})


@pytest.fixture
async def one(make_cluster: ClusterFactory) -> AsyncIterator[Cluster]:
    async with make_cluster([WorkerSpec("m1", "mad")]) as c:
        yield c


async def ok(resp: Any, status: int = 200) -> Any:
    assert resp.status == status, await resp.text()
    return await resp.json()


async def refused(resp: Any, status: int, code: str) -> str:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert body["code"] == code, body
    return str(body["error"])


async def test_set_read_and_delete_keys(one: Cluster) -> None:
    assert await ok(await one.call("GET", META)) == {}
    patch: dict[str, Any] = {"set": {"release.7": RELEASE, "release.current": "7"}}
    got = await ok(await one.call("PATCH", META, json=patch))
    assert got == {"release.7": RELEASE, "release.current": "7"}
    patch = {"set": {"release.8": "{}", "release.current": "8"}, "delete": ["release.7", "nope"]}
    got = await ok(await one.call("PATCH", META, json=patch))
    assert got == {"release.8": "{}", "release.current": "8"}
    assert await ok(await one.call("GET", META)) == got
    # deleted and set in one patch: the set wins, as it is applied after the deletes
    patch = {"set": {"release.8": "again"}, "delete": ["release.8"]}
    assert (await ok(await one.call("PATCH", META, json=patch)))["release.8"] == "again"


async def test_the_registry_row_carries_the_metadata_for_replicas(one: Cluster) -> None:
    assert isinstance(one.fleet, StaticFleet)
    registry = one.fleet.registry
    seq = registry.head()
    await ok(await one.call("PATCH", META, json={"set": {"release.1": RELEASE}}))
    changes, _, more = registry.changes_since(seq, 100)
    assert [(ch.table, ch.key) for ch in changes] == [("apps", "demo")] and not more
    assert changes[0].row is not None
    assert changes[0].row["metadata"] == {"release.1": RELEASE}
    head = registry.head()
    await ok(await one.call("PATCH", META, json={"set": {"release.1": RELEASE}}))
    assert registry.head() == head  # nothing changed, nothing published


async def test_limits_refuse_the_whole_patch(one: Cluster) -> None:
    key = "k" * 128
    await ok(await one.call("PATCH", META, json={"set": {key: "x" * MAX_VALUE_BYTES}}))
    why = await refused(
        await one.call("PATCH", META, json={"set": {"k" * 129: "x"}}), 400, "invalid"
    )
    assert "128" in why
    await refused(await one.call("PATCH", META, json={"set": {"a b": "x"}}), 400, "invalid")
    await refused(await one.call("PATCH", META, json={"set": {"": "x"}}), 400, "invalid")
    big = {"set": {"ok": "fine", "big": "x" * (MAX_VALUE_BYTES + 1)}}
    await refused(await one.call("PATCH", META, json=big), 413, "metadata_too_large")
    many = {"set": {f"k{i}": "" for i in range(MAX_KEYS)}}
    await refused(await one.call("PATCH", META, json=many), 413, "metadata_too_large")
    half = {"set": {f"r{i}": "x" * MAX_VALUE_BYTES for i in range(10)}}
    await ok(await one.call("PATCH", META, json=half))
    more = {"set": {f"s{i}": "x" * MAX_VALUE_BYTES for i in range(6)}}
    why = await refused(await one.call("PATCH", META, json=more), 413, "metadata_too_large")
    assert "MiB" in why
    got = await ok(await one.call("GET", META))
    assert len(got) == 11 and "ok" not in got and "s0" not in got
    # making room in the same patch is accepted
    room = {**more, "delete": [f"r{i}" for i in range(10)]}
    assert len(await ok(await one.call("PATCH", META, json=room))) == 7


async def test_bad_bodies_unknown_apps_and_tokens(one: Cluster) -> None:
    await refused(await one.call("PATCH", META, json={"set": {"a": 1}}), 400, "invalid")
    await refused(await one.call("PATCH", META, json={"metadata": {"a": "b"}}), 400, "invalid")
    await refused(await one.call("PATCH", META, json={"delete": "a"}), 400, "invalid")
    await refused(await one.call("GET", "/v1/apps/ghost/metadata"), 404, "not_found")
    await refused(
        await one.call("PATCH", "/v1/apps/ghost/metadata", json={"set": {"a": "b"}}),
        404,
        "not_found",
    )
    read_only = one.tokens["demo-read"]
    assert await ok(await one.call("GET", META, read_only)) == {}
    patch = {"set": {"a": "b"}}
    await refused(await one.call("PATCH", META, read_only, json=patch), 403, "forbidden")
    await refused(await one.call("GET", META, one.tokens["other"]), 403, "forbidden")
    assert await ok(await one.call("PATCH", META, one.tokens["demo"], json=patch)) == patch["set"]


async def test_a_deleted_app_comes_back_without_its_metadata(one: Cluster) -> None:
    await ok(await one.call("PATCH", META, json={"set": {"release.1": RELEASE}}))
    assert (await one.call("DELETE", "/v1/apps/demo")).status == 202
    await refused(await one.call("GET", META), 404, "not_found")
    await ok(await one.call("POST", "/v1/apps", json={"name": "demo"}), 201)
    assert await ok(await one.call("GET", META)) == {}


async def test_a_broker_without_the_registry_forwards_to_it(one: Cluster) -> None:
    registry_url = str(one.broker.make_url("")).rstrip("/")
    other = Broker(one.fleet, WorkerClient(), one.placer, registry_url=registry_url)
    async with TestClient(TestServer(make_broker_app(other, SECRET), host="127.0.0.1")) as client:
        auth = one.auth()
        resp = await client.patch(META, json={"set": {"release.2": RELEASE}}, headers=auth)
        assert await ok(resp) == {"release.2": RELEASE}
        assert await ok(await client.get(META, headers=auth)) == {"release.2": RELEASE}
        resp = await client.patch(META, json={"set": {"k" * 200: "x"}}, headers=auth)
        await refused(resp, 400, "invalid")
        resp = await client.get(META, headers={"Authorization": "Bearer nope"})
        assert resp.status == 401
    assert isinstance(one.fleet, StaticFleet)
    assert one.fleet.registry.metadata("demo") == {"release.2": RELEASE}


async def test_openapi_lists_app_metadata(one: Cluster) -> None:
    doc = await ok(await one.broker.get("/openapi.json"))
    assert set(doc["paths"]["/v1/apps/{app}/metadata"]) >= {"get", "patch"}


def test_metadata_survives_a_reopen_and_old_registries_gain_it(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    db = sqlite3.connect(old)
    db.executescript(
        "CREATE TABLE apps (name TEXT PRIMARY KEY, org TEXT NOT NULL, created_at TEXT NOT NULL,"
        " deleted INTEGER NOT NULL DEFAULT 0, seq INTEGER NOT NULL);"
        "INSERT INTO apps VALUES ('shop', 'personal', '2024-01-01T00:00:00.000Z', 0, 1);"
    )
    db.close()
    registry = AppRegistry(old)
    assert registry.metadata("shop") == {}
    registry.patch_metadata("shop", {"release.1": RELEASE}, [])
    registry.close()
    registry = AppRegistry(old)
    assert registry.metadata("shop") == {"release.1": RELEASE}
    assert registry.get("shop") is not None
    registry.close()


def test_the_rows_the_registry_holds_follow_every_write(tmp_path: Path) -> None:
    """Apps are read from memory (every create reads its app): after each kind of write the
    row held is the one the database has, as a registry opened afresh on it reads it."""
    path = tmp_path / "apps.db"
    registry = AppRegistry(path)

    def as_stored(name: str) -> Any:
        fresh = AppRegistry(path)
        try:
            return fresh.get(name, include_deleted=True)
        finally:
            fresh.close()

    assert registry.get("shop") is None
    registry.create("shop")
    registry.patch_metadata("shop", {"release.1": RELEASE}, [])
    assert registry.get("shop") == as_stored("shop")
    assert registry.metadata("shop") == {"release.1": RELEASE}
    stamp = "2026-11-27T00:00:00Z"
    record = SecretRecord(sealed="x", digest="d", created_at=stamp, updated_at=stamp)
    registry.patch_secrets("shop", {"TOKEN": record}, [])
    held = registry.get("shop")
    assert held == as_stored("shop") and held is not None and held.secrets_version == 1
    assert registry.delete("shop")
    assert registry.get("shop") is None
    assert registry.get("shop", include_deleted=True) == as_stored("shop")
    registry.create("shop")
    held = registry.get("shop")
    assert held == as_stored("shop") and held is not None and held.metadata == {}
    registry.close()

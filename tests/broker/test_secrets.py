"""App secrets: set, listed and unset through Fly's routes, sealed wherever they are kept, never
shown again; every machine of the app gets them in its environment, and `config.files` may
name one as a file's content."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.broker.fleet import StaticFleet
from souk.broker.server import make_app as make_broker_app
from souk.broker.state import Broker
from souk.cli.deploy.releases import AppRecord, Release
from souk.cli.deploy.secrets import current_digest, sync_env
from souk.clients.machines import MachinesClient
from souk.clients.workers import WorkerClient
from souk.models.machine import MachineFile
from souk.worker.host.files import FileRefused, write_files
from tests.support.broker_cluster import SECRET, Cluster, ClusterFactory, WorkerSpec

S = "/v1/apps/demo/secrets"
M = "/v1/apps/demo/machines"
PASSWORD = "correct-horse-battery-staple"
KEY_FILE = b"-----BEGIN KEY-----\nsekrit\n"


@pytest.fixture
async def one(make_cluster: ClusterFactory) -> AsyncIterator[Cluster]:
    async with make_cluster([WorkerSpec("m1", "mad", driver="process")]) as c:
        yield c


async def answer(resp: Any, status: int = 200) -> Any:
    text = await resp.text()
    assert resp.status == status, text
    assert PASSWORD not in text and "sekrit" not in text  # no route ever shows a value
    return json.loads(text) if text else None


def registry_of(c: Cluster) -> Any:
    assert isinstance(c.fleet, StaticFleet)
    return c.fleet.registry


async def test_set_list_get_unset_in_flys_shapes(one: Cluster) -> None:
    body = {"values": {"DB_PASSWORD": PASSWORD, "MODE": "prod"}}
    updated = await answer(await one.call("POST", S, json=body))
    assert updated["version"] == updated["Version"] == 1
    assert [s["name"] for s in updated["secrets"]] == ["DB_PASSWORD", "MODE"]
    assert set(updated["secrets"][0]) == {"name", "digest", "created_at", "updated_at"}

    listed = await answer(await one.call("GET", S, one.tokens["demo-read"]))
    assert listed == {"secrets": updated["secrets"]}
    digest = listed["secrets"][0]["digest"]

    # The same value again: same digest, a new version; another value: another digest.
    same = await answer(await one.call("POST", f"{S}/DB_PASSWORD", json={"value": PASSWORD}), 201)
    assert same["digest"] == digest and same["version"] == 2 and same["name"] == "DB_PASSWORD"
    assert same["created_at"] == listed["secrets"][0]["created_at"]
    changed = await answer(await one.call("POST", f"{S}/DB_PASSWORD", json={"value": "x"}), 201)
    assert changed["digest"] != digest

    got = await answer(await one.call("GET", f"{S}/MODE"))
    assert got["name"] == "MODE" and "value" not in got
    gone = await answer(await one.call("DELETE", f"{S}/MODE"))
    assert gone == {"version": 4, "Version": 4}
    assert (await one.call("DELETE", f"{S}/MODE")).status == 404
    assert (await one.call("GET", f"{S}/MODE")).status == 404
    unset = await answer(await one.call("POST", S, json={"values": {"DB_PASSWORD": None}}))
    assert unset["secrets"] == [] and unset["version"] == 5


async def test_values_never_come_back_and_are_sealed_where_kept(
    one: Cluster, tmp_path: Path
) -> None:
    await answer(await one.call("POST", S, json={"values": {"DB_PASSWORD": PASSWORD}}))
    resp = await one.call("GET", S, params={"show_secrets": "true"})
    assert resp.status == 403 and (await resp.json())["code"] == "secrets_write_only"
    resp = await one.call("GET", f"{S}/DB_PASSWORD", params={"show_secrets": "1"})
    assert resp.status == 403
    # The registry's row, what the catalog carries to every replica, holds it sealed.
    row = registry_of(one).get("demo")
    assert row.secrets["DB_PASSWORD"].sealed.startswith("souk-sealed-1:")
    assert PASSWORD not in row.model_dump_json()
    with contextlib.closing(sqlite3.connect(tmp_path / "registry.db")) as db:
        assert not any(PASSWORD in str(r) for r in db.execute("SELECT * FROM apps"))


async def test_who_may_set_and_read(one: Cluster) -> None:
    body = {"values": {"A": "1"}}
    assert (await one.call("POST", S, one.tokens["demo-read"], json=body)).status == 403
    assert (await one.call("POST", S, one.tokens["other"], json=body)).status == 403
    assert (await one.call("GET", S, one.tokens["other"])).status == 403
    await answer(await one.call("POST", S, one.tokens["demo"], json=body))
    assert (await one.call("DELETE", f"{S}/A", one.tokens["demo-read"])).status == 403
    await answer(await one.call("DELETE", f"{S}/A", one.tokens["demo"]))


async def test_bad_secrets_are_refused(one: Cluster) -> None:
    for values, status, reason in (
        ({"1BAD": "x"}, 400, "invalid"),
        ({"A-B": "x"}, 400, "invalid"),
        ({"NUL": "a\0b"}, 400, "invalid"),
        ({"BIG": "x" * (65 << 10)}, 413, "secret_too_large"),
    ):
        resp = await one.call("POST", S, json={"values": values})
        assert resp.status == status and (await resp.json())["code"] == reason, values
    assert registry_of(one).get("demo").secrets == {}
    resp = await one.call("POST", "/v1/apps/nope/secrets", json={"values": {"A": "1"}})
    assert resp.status == 404


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def _run(c: Cluster, config: dict[str, Any]) -> tuple[str, str]:
    """Create a machine of `config` that runs to its end; its id and its output."""
    config = {"restart": {"policy": "no"}, **config}
    created = await answer(await c.call("POST", M, json={"region": "mad", "config": config}))
    assert PASSWORD not in json.dumps(created)
    mid = created["id"]
    resp = await c.call("GET", f"{M}/{mid}/wait", params={"state": "stopped", "timeout": "20"})
    assert resp.status == 200, await resp.text()
    return mid, (c.engines["m1"].settings.rundir(mid) / "stdout.log").read_text()


SCRIPT = (
    'echo "$DB_PASSWORD|$MODE"; cat etc/app.conf; cat etc/keys/tls.key; stat -c %a etc/keys/tls.key'
)


async def test_a_machine_gets_secrets_in_env_and_files(one: Cluster) -> None:
    values = {"DB_PASSWORD": PASSWORD, "TLS_KEY": _b64(KEY_FILE)}
    await answer(await one.call("POST", S, json={"values": values}))
    config = {
        "init": {"exec": ["sh", "-c", SCRIPT]},
        "env": {"MODE": "prod", "DB_PASSWORD": "from-env"},  # the secret wins, as on Fly
        "files": [
            {"guest_path": "/etc/app.conf", "raw_value": _b64(b"port=8080\n"), "mode": 0o640},
            {"guest_path": "/etc/keys/tls.key", "secret_name": "TLS_KEY"},
        ],
    }
    mid, out = await _run(one, config)
    assert out.splitlines() == [
        f"{PASSWORD}|prod",
        "port=8080",
        *KEY_FILE.decode().splitlines(),
        "600",
    ]
    machine = await answer(await one.call("GET", f"{M}/{mid}"))
    assert machine["config"]["env"] == {"MODE": "prod", "DB_PASSWORD": "from-env"}
    # The worker keeps them sealed with its own key, in no table a catalog row is made from.
    engine = one.engines["m1"]
    db = engine.settings.db_path.read_bytes() + b"".join(
        p.read_bytes() for p in engine.settings.data_dir.glob("worker.db-*")
    )
    assert PASSWORD.encode() not in db
    assert os.stat(engine.settings.data_dir / "sealing.key").st_mode & 0o777 == 0o600

    # A changed secret reaches the machine with its next update (as a deploy makes one).
    await answer(await one.call("POST", f"{S}/DB_PASSWORD", json={"value": "rotated"}), 201)
    update = {"restart": {"policy": "no"}, **config}
    updated = await answer(await one.call("POST", f"{M}/{mid}", json={"config": update}))
    await answer(await one.call("POST", f"{M}/{mid}/start"))
    log = engine.settings.rundir(mid) / "stdout.log"
    deadline = time.monotonic() + 20
    while len(log.read_text().splitlines()) < 10 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert log.read_text().splitlines()[5] == "rotated|prod"
    assert updated["instance_id"] != machine["instance_id"]


async def test_files_naming_missing_or_non_base64_secrets_are_refused(one: Cluster) -> None:
    await answer(await one.call("POST", S, json={"values": {"PLAIN": "not base64!"}}))
    for name, reason in (("NOPE", "unknown_secret"), ("PLAIN", "invalid")):
        config = {
            "init": {"exec": ["true"]},
            "files": [{"guest_path": "/f", "secret_name": name}],
        }
        resp = await one.call("POST", M, json={"region": "mad", "config": config})
        body = await resp.json()
        assert resp.status == 400 and body["code"] == reason, body
        assert "config.files[0].secret_name" in body["error"]
    bad = {"init": {"exec": ["true"]}, "files": [{"guest_path": "rel", "raw_value": "eA=="}]}
    resp = await one.call("POST", M, json={"region": "mad", "config": bad})
    assert resp.status == 400 and "guest_path" in await resp.text()


async def test_a_forwarding_broker_sends_secrets_to_the_registry(one: Cluster) -> None:
    registry_url = str(one.broker.make_url("")).rstrip("/")
    other = Broker(one.fleet, WorkerClient(), one.placer, registry_url=registry_url)
    async with TestClient(TestServer(make_broker_app(other, SECRET), host="127.0.0.1")) as client:
        deploy = {"Authorization": f"Bearer {one.tokens['demo']}"}
        resp = await client.post(S, json={"values": {"DB_PASSWORD": PASSWORD}}, headers=deploy)
        await answer(resp)
        listed = await answer(await client.get(S, headers=deploy))
        assert [s["name"] for s in listed["secrets"]] == ["DB_PASSWORD"]
        await answer(await client.delete(f"{S}/DB_PASSWORD", headers=deploy))
    assert registry_of(one).get("demo").secrets == {}


def test_files_never_leave_their_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "etc").symlink_to(outside)  # what an app may have left in its own directory
    (root / "link").symlink_to(outside / "target")
    with pytest.raises(FileRefused, match=r"/etc/app\.conf"):
        write_files(root, [MachineFile(guest_path="/etc/app.conf", raw_value="eA==")], {})
    write_files(root, [MachineFile(guest_path="/link", raw_value="eA==")], {})
    assert list(outside.iterdir()) == []
    assert (root / "link").read_bytes() == b"x" and not (root / "link").is_symlink()


async def test_a_deploy_sets_its_env_as_secrets_and_unsets_what_it_dropped(one: Cluster) -> None:
    url = str(one.broker.make_url("")).rstrip("/")
    async with MachinesClient(url, one.tokens["demo"]) as api:
        await api.update_secrets("demo", {"MANUAL": "kept"})  # set with `souk secrets`
        first = await sync_env(api, "demo", {"A": "1", "B": "2"}, AppRecord.of({}))
        release = Release(
            version=1, status="complete", strategy="rolling", config={}, created_at=""
        )
        release = release.model_copy(update={"env": ["A", "B"], "env_as_secrets": True})
        meta = AppRecord.of({release.key(): release.encode(), "release.current": "1"})
        assert meta.managed_names() == {"A", "B"}
        second = await sync_env(api, "demo", {"A": "1"}, meta)
        assert [s.name for s in (await api.secrets("demo")).secrets] == ["A", "MANUAL"]
        assert second != first and second == await current_digest(api, "demo")
        assert await sync_env(api, "demo", {"A": "1"}, meta) == second  # same values, same digest


async def test_a_secret_that_does_not_open_stops_creates_not_listings(one: Cluster) -> None:
    await answer(await one.call("POST", S, json={"values": {"A": PASSWORD}}))
    registry = registry_of(one)
    moved = registry.get("demo").secrets["A"]
    registry.patch_secrets("demo", {"B": moved}, [])  # copied under another name: bound to A
    config = {"init": {"exec": ["true"]}}
    resp = await one.call("POST", M, json={"region": "mad", "config": config})
    body = await resp.json()
    assert resp.status == 500 and body["code"] == "sealed_unreadable" and "B" in body["error"]
    assert PASSWORD not in json.dumps(body)
    assert [s["name"] for s in (await answer(await one.call("GET", S)))["secrets"]] == ["A", "B"]
    await answer(await one.call("POST", f"{S}/B", json={"value": "fresh"}), 201)  # set again
    resp = await one.call("POST", M, json={"region": "mad", "config": config, "skip_launch": True})
    assert resp.status == 200, await resp.text()

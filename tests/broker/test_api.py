"""The broker's public API over real HTTP, in front of real sim-driver workers."""

from __future__ import annotations

import asyncio
from typing import Any

from souk.broker.fleet import StaticFleet
from tests.support.broker_cluster import Cluster, machine_body

M = "/v1/apps/demo/machines"


async def ok(resp: Any, status: int = 200) -> Any:
    assert resp.status == status, await resp.text()
    return await resp.json() if resp.content_type == "application/json" else None


async def err(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    body: dict[str, Any] = await resp.json()
    assert isinstance(body["error"], str) and isinstance(body["status"], str)
    return body


async def create(c: Cluster, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = await ok(await c.call("POST", M, json=machine_body(**kw)))
    return body


async def test_machine_lifecycle(small: Cluster) -> None:
    c = small
    m = await create(c)
    assert m["region"] == "mad" and m["worker"] in ("m1", "m2") and m["app"] == "demo"
    assert m["state"] == "started"  # the worker's answer, relayed: it waited for the start
    mid = m["id"]
    assert await ok(await c.call("GET", f"{M}/{mid}/wait", params={"state": "started"})) == {
        "ok": True
    }
    got = await ok(await c.call("GET", f"{M}/{mid}"))
    assert got["state"] == "started" and got["instance_id"] == m["instance_id"]
    await ok(await c.call("POST", f"{M}/{mid}/stop", json={"signal": "SIGTERM"}))
    await ok(await c.call("GET", f"{M}/{mid}/wait", params={"state": "stopped", "timeout": "10"}))
    await ok(await c.call("POST", f"{M}/{mid}/start"))
    await ok(await c.call("GET", f"{M}/{mid}/wait", params={"state": "started"}))
    await ok(await c.call("POST", f"{M}/{mid}/restart"))
    events = await ok(await c.call("GET", f"{M}/{mid}/events"))
    assert any(e["type"].startswith("restart") for e in events)
    body = await err(await c.call("DELETE", f"{M}/{mid}"), 412)  # as Fly answers it
    assert "force" in body["error"] and body["code"] == "failed_precondition"
    await ok(await c.call("DELETE", f"{M}/{mid}", params={"force": "true"}))
    await ok(await c.call("GET", f"{M}/{mid}/wait", params={"state": "destroyed"}))
    listed = await ok(await c.call("GET", M))
    assert mid not in [x["id"] for x in listed]
    listed = await ok(await c.call("GET", M, params={"include_deleted": "true"}))
    assert mid in [x["id"] for x in listed]


async def test_wait_times_out_with_408_and_the_current_state(small: Cluster) -> None:
    m = await ok(await small.call("POST", M, json={**machine_body(), "skip_launch": True}))
    body = await err(
        await small.call("GET", f"{M}/{m['id']}/wait", params={"state": "started", "timeout": "0"}),
        408,
    )
    assert body["state"] == "created"
    await err(await small.call("GET", f"{M}/{m['id']}/wait", params={"timeout": "61"}), 400)
    await err(await small.call("GET", f"{M}/{m['id']}/wait", params={"state": "asleep"}), 400)


async def test_list_filters(small: Cluster) -> None:
    c = small
    a = await create(c, region="mad", metadata={"role": "web"})
    b = await create(c, region="ams", metadata={"role": "db"})
    ids = lambda xs: {x["id"] for x in xs}  # noqa: E731
    assert ids(await ok(await c.call("GET", M))) == {a["id"], b["id"]}
    assert ids(await ok(await c.call("GET", M, params={"region": "ams"}))) == {b["id"]}
    assert ids(await ok(await c.call("GET", M, params={"metadata.role": "web"}))) == {a["id"]}
    await ok(await c.call("GET", f"{M}/{a['id']}/wait", params={"state": "started"}))
    await ok(await c.call("GET", f"{M}/{b['id']}/wait", params={"state": "started"}))
    assert ids(await ok(await c.call("GET", M, params={"state": "started,stopped"}))) == {
        a["id"],
        b["id"],
    }
    assert ids(await ok(await c.call("GET", M, params={"state": "stopped"}))) == set()
    await err(await c.call("GET", M, params={"state": "bogus"}), 400)


async def test_update_in_place_gets_a_new_instance_id(small: Cluster) -> None:
    m = await create(small, region="ams")  # ams has one 4-cpu worker
    config = {**machine_body()["config"], "env": {"A": "1"}}
    await ok(await small.call("POST", f"{M}/{m['id']}", json={"config": config}))
    # the worker answers once the update is accepted; the new version appears when it has run
    for _ in range(200):
        updated = await ok(await small.call("GET", f"{M}/{m['id']}"))
        if updated["instance_id"] != m["instance_id"] and updated["state"] == "started":
            break
        await asyncio.sleep(0.01)
    assert updated["instance_id"] != m["instance_id"]
    assert updated["worker"] == m["worker"] and updated["config"]["env"] == {"A": "1"}
    big = {**config, "guest": {"cpus": 4, "memory_mb": 1024}}
    await create(small, region="ams")  # a neighbour: now 4 cpus no longer fit in place
    body = await err(await small.call("POST", f"{M}/{m['id']}", json={"config": big}), 412)
    assert body["status"] == "insufficient_capacity" and body["details"]["region"] == "ams"
    moved = {"config": config, "region": "mad"}
    body = await err(await small.call("POST", f"{M}/{m['id']}", json=moved), 400)
    assert body["error"].startswith("region")
    stale = {"config": config, "current_version": "nope"}
    await err(await small.call("POST", f"{M}/{m['id']}", json=stale), 412)


async def test_metadata_endpoints(small: Cluster) -> None:
    m = await create(small, metadata={"a": "1"})
    base = f"{M}/{m['id']}/metadata"
    assert await ok(await small.call("GET", base)) == {"a": "1"}
    assert (await small.call("POST", base + "/b", json={"value": "2"})).status == 204
    assert (await small.call("DELETE", base + "/a")).status == 204
    assert await ok(await small.call("GET", base)) == {"b": "2"}
    patch = {"metadata": {"b": None, "c": "3"}}
    assert (await small.call("PATCH", base, json=patch)).status == 204
    assert await ok(await small.call("GET", base)) == {"c": "3"}
    await err(await small.call("PATCH", base, json={**patch, "machine_version": "old"}), 412)
    await ok(await small.call("POST", f"{M}/{m['id']}/cordon"))
    assert (await ok(await small.call("GET", base)))["souk_cordoned"] == "true"
    await ok(await small.call("POST", f"{M}/{m['id']}/uncordon"))
    assert "souk_cordoned" not in await ok(await small.call("GET", base))


async def test_leases_block_other_writers(small: Cluster) -> None:
    m = await create(small)
    mid = m["id"]
    lease = await ok(await small.call("POST", f"{M}/{mid}/lease", json={"ttl": 30}))
    assert lease["version"] == m["instance_id"]
    assert (await ok(await small.call("GET", f"{M}/{mid}/lease")))["nonce"] == lease["nonce"]
    body = await err(await small.call("POST", f"{M}/{mid}/stop"), 409)
    assert body["code"] == "lease_held"
    await err(await small.call("POST", f"{M}/{mid}/lease", json={"ttl": 30}), 409)
    headers = {"fly-machine-lease-nonce": lease["nonce"]}
    await ok(await small.call("POST", f"{M}/{mid}/stop", headers={**small.auth(), **headers}))
    await err(await small.call("DELETE", f"{M}/{mid}/lease"), 409)
    await ok(await small.call("DELETE", f"{M}/{mid}/lease", headers={**small.auth(), **headers}))
    await err(await small.call("GET", f"{M}/{mid}/lease"), 404)
    leased = await ok(await small.call("POST", M, json={**machine_body(), "lease_ttl": 30}))
    assert leased["nonce"]
    await err(await small.call("POST", f"{M}/{leased['id']}/stop"), 409)


async def test_unknown_things_are_404(small: Cluster) -> None:
    for path in (f"{M}/nosuchmachine", f"{M}/nosuchmachine/wait", "/v1/apps/ghost"):
        body = await err(await small.call("GET", path), 404)
        assert body["code"] == "not_found"
    await err(await small.call("GET", "/v1/apps/ghost/machines"), 404)
    await err(await small.call("POST", "/v1/apps/ghost/machines", json=machine_body()), 404)
    m = await create(small)
    await small.call("POST", "/v1/apps", json={"name": "other"})
    # a machine is only found under its own app
    await err(await small.call("GET", f"/v1/apps/other/machines/{m['id']}"), 404)


async def test_validation_errors_name_the_field(small: Cluster) -> None:
    c = small
    json_h = {**c.auth(), "Content-Type": "application/json"}
    body = await err(await c.broker.post(M, data=b"{nope", headers=json_h), 400)
    assert body["code"] == "invalid_json"
    body = await err(
        await c.call("POST", M, json={**machine_body(), "region": ["mad", "ams"]}), 400
    )
    assert body["error"].startswith("region")
    body = await err(await c.call("POST", M, json={**machine_body(), "region": "mad,ams"}), 400)
    assert body["error"].startswith("region")
    body = await err(await c.call("POST", M, json=machine_body(region="nowhere")), 400)
    assert body["error"].startswith("region")
    wrong_type = machine_body()
    wrong_type["config"]["guest"]["cpus"] = "many"
    body = await err(await c.call("POST", M, json=wrong_type), 400)
    assert body["error"].startswith("config.guest.cpus")
    body = await err(await c.call("POST", M, json={**machine_body(), "colour": "red"}), 400)
    assert "colour" in body["error"]
    body = await err(await c.call("POST", M, json=machine_body(region="iad")), 400)
    assert body["details"]["regions"] == sorted(body["details"]["regions"]) != []
    huge = machine_body(env={"A": "x" * (2 << 20)})
    await err(await c.call("POST", M, json=huge), 413)
    body = await err(
        await c.call("POST", M, params={"strategy": "lottery"}, json=machine_body()), 400
    )
    assert body["error"].startswith("strategy")
    body = await err(await c.call("POST", "/v1/apps", json={"name": "Bad Name!"}), 400)
    assert body["error"].startswith("name")
    await err(await c.call("POST", "/v1/apps", json={"name": "demo"}), 409)


async def test_tokens(small: Cluster) -> None:
    c = small
    body = await err(await c.broker.get(M), 401)
    assert body["code"] == "unauthorized"
    await err(await c.broker.get(M, headers={"Authorization": "Bearer souk1_forged.sig"}), 401)
    await err(await c.broker.get(M, headers={"Authorization": "Basic abc"}), 401)
    await ok(await c.call("GET", M, token=c.tokens["demo"]))
    await ok(await c.call("GET", M, token=c.tokens["demo-read"]))
    body = await err(await c.call("POST", M, token=c.tokens["demo-read"], json=machine_body()), 403)
    assert "read-only" in body["error"]
    body = await err(await c.call("GET", M, token=c.tokens["other"]), 403)
    assert "demo" in body["error"]
    await err(await c.call("POST", "/v1/apps", token=c.tokens["demo"], json={"name": "x"}), 403)
    apps = await ok(await c.call("GET", "/v1/apps", token=c.tokens["other"]))
    assert apps["total_apps"] == 0
    await err(await c.call("GET", "/v1/workers", token=c.tokens["admin"]), 403)
    assert (await c.broker.get("/openapi.json")).status == 200


async def test_apps(small: Cluster) -> None:
    c = small
    created = await ok(await c.call("POST", "/v1/apps", json={"name": "shop"}), 201)
    assert created["name"] == "shop" and created["organization"]["slug"] == "personal"
    listed = await ok(await c.call("GET", "/v1/apps"))
    assert {a["name"] for a in listed["apps"]} == {"demo", "shop"}
    assert listed["total_apps"] == 2
    m = await create(c)
    assert (await ok(await c.call("GET", "/v1/apps/demo")))["machine_count"] >= 0
    assert isinstance(c.fleet, StaticFleet)
    await c.fleet.refresh()
    body = await err(await c.call("DELETE", "/v1/apps/demo"), 409)
    assert m["id"] in body["details"]["machines"]
    assert (await c.call("DELETE", "/v1/apps/shop")).status == 202
    await err(await c.call("GET", "/v1/apps/shop"), 404)


async def test_operators_cordon_workers(small: Cluster) -> None:
    c = small
    op = c.tokens["operator"]
    workers = await ok(await c.call("GET", "/v1/workers", token=op))
    assert {w["id"] for w in workers} == {"m1", "m2", "a1"}
    await ok(await c.call("POST", "/v1/workers/m1/cordon", token=op))
    for _ in range(4):
        assert (await create(c))["worker"] == "m2"
    body = await err(await c.call("POST", M, json=machine_body()), 412)
    assert {"worker": "m1", "reason": "cordoned"} in body["details"]["refusals"]
    await ok(await c.call("POST", "/v1/workers/m1/uncordon", token=op))
    await err(await c.call("POST", "/v1/workers/nope/cordon", token=op), 404)


async def test_openapi_lists_the_public_paths(small: Cluster) -> None:
    doc = await ok(await small.broker.get("/openapi.json"))
    assert "/v1/apps/{app}/machines/{id}/wait" in doc["paths"]
    assert "CreateMachineRequest" in doc["components"]["schemas"]

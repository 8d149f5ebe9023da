"""The worker's HTTP API in-process: status codes, error bodies, the generated OpenAPI document."""

from __future__ import annotations

from typing import Any

from tests.support.clients import Client

SLEEP: dict[str, Any] = {"app": "demo", "config": {"init": {"exec": ["sleep", "30"]}}}


async def error_of(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    body: dict[str, Any] = await resp.json()
    assert set(body) >= {"error", "status", "code"}
    return body


async def test_create_wait_stop_destroy_over_http(client: Client) -> None:
    resp = await client.post("/v1/machines", json=SLEEP)
    assert resp.status == 201
    machine = await resp.json()
    mid = machine["id"]
    resp = await client.get(
        f"/v1/machines/{mid}/wait", params={"state": "started", "timeout": "10"}
    )
    assert resp.status == 200 and (await resp.json())["ok"] is True
    assert (await client.post(f"/v1/machines/{mid}/stop", json={"timeout": "2s"})).status == 200
    resp = await client.get(
        f"/v1/machines/{mid}/wait", params={"state": "stopped", "timeout": "10"}
    )
    assert (await resp.json())["state"] == "stopped"
    assert (await client.delete(f"/v1/machines/{mid}")).status == 200
    resp = await client.get(f"/v1/machines/{mid}/wait", params={"state": "destroyed"})
    assert resp.status == 200
    listed = await (await client.get("/v1/machines")).json()
    assert mid not in [m["id"] for m in listed]
    listed = await (await client.get("/v1/machines", params={"include_deleted": "true"})).json()
    assert mid in [m["id"] for m in listed]
    events = await (await client.get(f"/v1/machines/{mid}/events")).json()
    assert (events[0]["type"], events[0]["step"]) == ("destroy", "end_destroy")


async def test_a_create_with_start_answers_once_its_machine_runs(client: Client) -> None:
    resp = await client.post("/v1/machines", json=SLEEP)
    assert resp.status == 201
    machine = await resp.json()
    assert machine["state"] == "started"  # no second round trip needed to see it run
    resp = await client.get(
        f"/v1/machines/{machine['id']}/wait", params={"state": "started", "timeout": "0"}
    )
    assert resp.status == 200
    body = {**SLEEP, "start": False}
    assert (await (await client.post("/v1/machines", json=body)).json())["state"] == "created"


async def test_wait_times_out_with_408(client: Client) -> None:
    body = {**SLEEP, "start": False}
    mid = (await (await client.post("/v1/machines", json=body)).json())["id"]
    resp = await client.get(f"/v1/machines/{mid}/wait", params={"state": "started", "timeout": "0"})
    body = await error_of(resp, 408)  # the error shape the document gives 408, and the state
    assert (body["status"], body["state"], body["ok"]) == ("timeout", "created", False)


async def test_logs_hold_what_the_process_printed(client: Client) -> None:
    body = {"app": "demo", "config": {"init": {"exec": ["sh", "-c", "echo hello; sleep 30"]}}}
    mid = (await (await client.post("/v1/machines", json=body)).json())["id"]
    await client.get(f"/v1/machines/{mid}/wait", params={"state": "started"})
    text = ""
    for _ in range(100):
        text = await (await client.get(f"/v1/machines/{mid}/logs")).text()
        if text:
            break
    assert text == "hello\n"
    await client.delete(f"/v1/machines/{mid}", params={"force": "true"})


async def test_bad_requests_get_4xx_with_a_reason(client: Client) -> None:
    post = "/v1/machines"
    body = await error_of(await client.post(post, data=b"{nope", headers=_json), 400)
    assert body["status"] == "invalid_json"
    body = await error_of(await client.post(post, json={"app": "demo", "config": {"init": 5}}), 400)
    assert body["status"] == "invalid" and "config.init" in body["error"]
    unknown = {"app": "demo", "config": {"init": {"exec": ["x"]}, "colour": "red"}}
    body = await error_of(await client.post(post, json=unknown), 400)
    assert "colour" in body["error"]
    body = await error_of(await client.post(post, json={"app": "demo"}), 400)
    assert "config" in body["error"]
    body = await error_of(await client.post(post, json={"app": "Bad App!", **SLEEP["config"]}), 400)
    huge = {"app": "demo", "config": {"init": {"exec": ["x"]}, "env": {"A": "x" * (2 << 20)}}}
    await error_of(await client.post(post, json=huge), 413)
    await error_of(
        await client.post(post, data=b"app=x", headers={"Content-Type": "text/plain"}), 415
    )
    too_big = {"app": "demo", "config": {"init": {"exec": ["x"]}, "guest": {"cpus": 99}}}
    body = await error_of(await client.post(post, json=too_big), 412)
    assert body["status"] == "insufficient_capacity" and body["details"]["free"]["cpus"] == 4
    await error_of(await client.get("/v1/machines/nosuch"), 404)
    await error_of(await client.post("/v1/machines/nosuch/start"), 404)
    await error_of(await client.get("/v1/machines/nosuch/wait?state=bogus"), 400)
    await error_of(await client.get("/v1/nothing-here"), 404)
    listed = await (await client.get("/v1/machines")).json()
    assert listed == []  # nothing was half-created by any of the above


async def test_illegal_transition_is_409(client: Client) -> None:
    mid = (await (await client.post("/v1/machines", json={**SLEEP, "start": False})).json())["id"]
    body = await error_of(await client.post(f"/v1/machines/{mid}/stop"), 409)
    assert body["status"] == "invalid_state" and "created" in body["error"]
    body = await error_of(await client.post(f"/v1/machines/{mid}/restart"), 409)
    assert body["status"] == "invalid_state"
    resp = await client.post(f"/v1/machines/{mid}/start")
    assert resp.status == 200
    again = await client.post(f"/v1/machines/{mid}/start")  # already on its way: a no-op
    assert again.status == 200
    bad = await client.get(f"/v1/machines/{mid}/wait", params={"timeout": "600"})
    await error_of(bad, 400)


async def test_cordon_and_capacity(client: Client) -> None:
    assert (await (await client.post("/v1/cordon")).json())["cordoned"] is True
    body = await error_of(await client.post("/v1/machines", json=SLEEP), 409)
    assert body["status"] == "cordoned"
    assert (await (await client.post("/v1/uncordon")).json())["cordoned"] is False
    cap = await (await client.get("/v1/capacity")).json()
    assert cap["total"] == {"cpus": 4, "memory_mb": 4096} and cap["free"] == cap["total"]


async def test_offer_says_whether_a_guest_fits(client: Client) -> None:
    fits = await (await client.post("/v1/offers", json={"guest": {"cpus": 2}})).json()
    assert fits["fits"] is True and fits["capacity"]["worker"] == "w1"
    nope = await (await client.post("/v1/offers", json={"guest": {"cpus": 8}})).json()
    assert nope["fits"] is False


async def test_openapi_is_generated_from_the_routes(client: Client) -> None:
    doc = await (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    assert (
        "post" in doc["paths"]["/v1/machines"] and "get" in doc["paths"]["/v1/machines/{id}/wait"]
    )
    schema = doc["paths"]["/v1/machines"]["post"]["requestBody"]["content"]["application/json"]
    assert schema["schema"]["$ref"] == "#/components/schemas/CreateMachine"
    assert "MachineConfig" in doc["components"]["schemas"]


_json = {"Content-Type": "application/json"}


async def test_a_lease_blocks_other_writers_until_released(client: Client) -> None:
    mid = (await (await client.post("/v1/machines", json={**SLEEP, "start": False})).json())["id"]
    lease = await (await client.post(f"/v1/machines/{mid}/lease", json={"ttl": 60})).json()
    held = {"fly-machine-lease-nonce": lease["nonce"]}
    body = await error_of(await client.post(f"/v1/machines/{mid}/lease", json={"ttl": 5}), 409)
    assert body["status"] == "lease_held"
    body = await error_of(await client.post(f"/v1/machines/{mid}/start"), 409)
    assert body["status"] == "lease_held"
    patch = {"set": {"role": "web"}}
    await error_of(await client.patch(f"/v1/machines/{mid}/metadata", json=patch), 409)
    assert (await client.post(f"/v1/machines/{mid}/start", headers=held)).status == 200
    again = await client.post(f"/v1/machines/{mid}/lease", json={"ttl": 90}, headers=held)
    assert (await again.json())["nonce"] == lease["nonce"]  # the holder extends its own
    assert (await (await client.get(f"/v1/machines/{mid}/lease")).json())["nonce"] == lease["nonce"]
    await error_of(await client.delete(f"/v1/machines/{mid}/lease"), 409)
    assert (await client.delete(f"/v1/machines/{mid}/lease", headers=held)).status == 200
    await error_of(await client.get(f"/v1/machines/{mid}/lease"), 404)
    assert (await client.delete(f"/v1/machines/{mid}", params={"force": "true"})).status == 200


async def test_metadata_changes_in_place_without_a_restart(client: Client) -> None:
    created = await (await client.post("/v1/machines", json=SLEEP)).json()
    mid = created["id"]
    await client.get(f"/v1/machines/{mid}/wait", params={"state": "started"})
    resp = await client.patch(f"/v1/machines/{mid}/metadata", json={"set": {"a": "1", "b": "2"}})
    assert (await resp.json())["config"]["metadata"] == {"a": "1", "b": "2"}
    resp = await client.patch(f"/v1/machines/{mid}/metadata", json={"delete": ["a"]})
    machine = await resp.json()
    assert machine["config"]["metadata"] == {"b": "2"}
    assert machine["instance_id"] == created["instance_id"] and machine["state"] == "started"
    events = await (await client.get(f"/v1/machines/{mid}/events")).json()
    assert not any(e["type"] == "stop" for e in events)
    await client.delete(f"/v1/machines/{mid}", params={"force": "true"})


async def test_update_answers_with_the_new_version(client: Client) -> None:
    created = await (await client.post("/v1/machines", json=SLEEP)).json()
    mid = created["id"]
    await client.get(f"/v1/machines/{mid}/wait", params={"state": "started"})
    new = {"config": {"init": {"exec": ["sleep", "31"]}, "env": {"V": "2"}}}
    updated = await (await client.put(f"/v1/machines/{mid}", json=new)).json()
    assert updated["instance_id"] != created["instance_id"]
    assert updated["config"]["env"] == {"V": "2"}
    resp = await client.get(
        f"/v1/machines/{mid}/wait",
        params={"state": "started", "instance_id": updated["instance_id"], "timeout": "10"},
    )
    assert resp.status == 200
    steps = [
        f"{e['type']}.{e['step']}"
        for e in await (await client.get(f"/v1/machines/{mid}/events")).json()
    ]
    assert "update.apply_config" in steps and "stop.end_stop" in steps
    await client.delete(f"/v1/machines/{mid}", params={"force": "true"})

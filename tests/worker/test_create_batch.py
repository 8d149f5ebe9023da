"""A batch of creates (`POST /v1/machines/batch`): each create reserved and answered as it would
be alone, in order; one refused leaves the others as they were; the confirmations riding with
it end their holds as `POST /v1/confirmations` would."""

from __future__ import annotations

from typing import Any

from souk.models.api import HOLD_HEADER, MAX_BATCH
from souk.worker.engine import Engine
from tests.support.clients import Client


def create(machine_id: str, cpus: int = 1) -> dict[str, Any]:
    config = {"init": {"exec": ["sleep", "60"]}, "guest": {"cpus": cpus}}
    return {"app": "demo", "id": machine_id, "config": config}


async def test_each_create_of_a_batch_is_answered_as_it_would_be_alone(
    client: Client, engine: Engine
) -> None:
    resp = await client.post("/v1/machines", json=create("taken1"))
    assert resp.status == 201, await resp.text()
    alone = {}
    for machine_id, cpus in (("taken1", 1), ("huge01", 64)):  # a conflict, and no room
        resp = await client.post("/v1/machines", json=create(machine_id, cpus))
        alone[machine_id] = (resp.status, (await resp.json())["code"])
    batch = [create("batch1"), create("taken1"), create("huge01", 64), create("batch2")]
    resp = await client.post(
        "/v1/machines/batch", json={"machines": batch}, headers={HOLD_HEADER: "30"}
    )
    assert resp.status == 200, await resp.text()
    outcomes = (await resp.json())["outcomes"]
    got = [
        (o["status"], (o.get("machine") or {}).get("id") or o["error"]["code"]) for o in outcomes
    ]
    assert got == [(201, "batch1"), alone["taken1"], alone["huge01"], (201, "batch2")]
    assert {m.id for m in engine.machines()} == {"taken1", "batch1", "batch2"}
    for machine_id in ("batch1", "batch2"):  # started, as a create alone answers them, and held
        assert engine.get(machine_id).state == "started"
        assert engine.provisional_until(machine_id) is not None


async def test_a_batch_out_of_bounds_is_refused_whole(client: Client, engine: Engine) -> None:
    for machines in ([], [create(f"many{i:03}") for i in range(MAX_BATCH + 1)]):
        resp = await client.post("/v1/machines/batch", json={"machines": machines})
        assert resp.status == 400, await resp.text()
        assert (await resp.json())["code"] == "invalid"
    bad = [create("good01"), {"app": "demo", "config": {"nonsense": 1}}]
    resp = await client.post("/v1/machines/batch", json={"machines": bad})
    assert resp.status == 400
    assert engine.machines() == []  # nothing of a refused batch was recorded


async def test_confirmations_riding_with_a_batch_end_their_holds(
    client: Client, engine: Engine
) -> None:
    held = {HOLD_HEADER: "30"}
    resp = await client.post(
        "/v1/machines/batch", json={"machines": [create("first1")]}, headers=held
    )
    assert resp.status == 200, await resp.text()
    assert engine.provisional_until("first1") is not None
    body = {"machines": [create("second")], "confirm": ["first1", "nosuch"]}
    resp = await client.post("/v1/machines/batch", json=body, headers=held)
    assert resp.status == 200, await resp.text()
    answer = await resp.json()
    assert answer["holds"] == {"first1": "confirmed", "nosuch": "unknown"}
    assert [o["status"] for o in answer["outcomes"]] == [201]
    assert engine.provisional_until("first1") is None
    assert engine.provisional_until("second") is not None  # its own confirmation is to come
    logged = [(e.type, e.step) for e in engine.events("first1")]
    assert ("hold", "confirmed") in logged

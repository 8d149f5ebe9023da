"""Provisional holds in-process: a machine created with a hold is destroyed by its worker unless
confirmed in time; a confirmed one stays; the HTTP API checks what it is sent."""

from __future__ import annotations

import asyncio
from pathlib import Path

from souk.models.api import HOLD_HEADER
from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.machines import holds
from souk.worker.state import queries
from souk.worker.state.operations import MACHINE_QUEUE
from tests.support.clients import Client
from tests.support.engines import settings


def request(machine_id: str, start: bool = True) -> CreateMachine:
    config = MachineConfig.model_validate({"init": {"exec": ["sleep", "60"]}})
    return CreateMachine(app="demo", id=machine_id, config=config, start=start)


async def test_an_unconfirmed_machine_is_destroyed_when_its_hold_ends(sim_engine: Engine) -> None:
    machine = await sim_engine.create(request("held01"), hold=0.2)
    assert sim_engine.provisional_until(machine.id) is not None
    assert sim_engine.capacity().machines == 1  # held while provisional
    ok, found = await sim_engine.wait(machine.id, "destroyed", 10, None)
    assert ok, found.state
    assert sim_engine.capacity().machines == 0
    assert sim_engine.provisional_until(machine.id) is None
    logged = [(e.type, e.step) for e in sim_engine.events(machine.id)]
    assert ("hold", "expired") in logged and ("destroy", "end_destroy") in logged
    assert await sim_engine.confirm([machine.id]) == {machine.id: "expired"}


async def test_a_confirmed_machine_stays(sim_engine: Engine) -> None:
    kept = await sim_engine.create(request("kept01"), hold=0.2)
    plain = await sim_engine.create(request("plain1"))  # no hold asked: never provisional
    assert plain.id and sim_engine.provisional_until(plain.id) is None
    got = await sim_engine.confirm([kept.id, kept.id, "nosuch"])
    assert got == {kept.id: "confirmed", "nosuch": "unknown"}
    assert await sim_engine.confirm([kept.id]) == {kept.id: "confirmed"}  # again: same answer
    await asyncio.sleep(0.4)
    assert sim_engine.get(kept.id).state == "started"
    assert sim_engine.get(plain.id).state == "started"
    assert ("hold", "confirmed") in [(e.type, e.step) for e in sim_engine.events(kept.id)]


async def test_a_hold_that_ends_while_the_worker_is_down_ends_at_its_start(tmp_path: Path) -> None:
    s = settings(tmp_path)
    async with running(Engine(s, make_driver("sim", s))) as first:
        await first.create(request("down01", start=False), hold=0.2)
        # the deadline is in the database, not in a timer of this run
        assert queries.next_hold(first.store.read) is not None
        await first.holds.close()  # this run will not get to it
    await asyncio.sleep(0.3)
    async with running(Engine(s, make_driver("sim", s))) as second:
        ok, found = await second.wait("down01", "destroyed", 10, None)
        assert ok, found.state


async def test_expiry_spares_a_machine_already_being_destroyed(sim_engine: Engine) -> None:
    machine = await sim_engine.create(request("gone01", start=False), hold=30)
    await sim_engine.submit(machine.id, "destroy", {"force": True})
    await sim_engine.wait(machine.id, "destroyed", 10, None)
    due = await sim_engine.store.write(lambda tx: holds.expire_due(tx, now=1e12))
    assert due == [machine.id]
    assert MACHINE_QUEUE.has_pending(sim_engine.store.read, machine.id) is False


async def test_the_api_takes_a_hold_and_confirmations(client: Client) -> None:
    body = {"app": "demo", "id": "api001", "config": {"init": {"exec": ["sleep", "60"]}}}
    for bad in ("0", "-1", "soon", "99999"):
        resp = await client.post("/v1/machines", json=body, headers={HOLD_HEADER: bad})
        assert resp.status == 400, bad
        assert HOLD_HEADER in (await resp.json())["error"]
    resp = await client.post("/v1/machines", json=body, headers={HOLD_HEADER: "30"})
    assert resp.status == 201, await resp.text()
    resp = await client.post("/v1/confirmations", json={"ids": ["api001"]})
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"holds": {"api001": "confirmed"}}
    resp = await client.post("/v1/confirmations", json={"ids": []})
    assert resp.status == 400

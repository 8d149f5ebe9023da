"""Provisional holds against a real worker process: `kill -9` while creates are in flight, so
some are committed but never answered, and none of those outlives its hold.

The client here plays the broker: it sends every create with a hold and confirms each machine
as soon as its answer arrives. What must hold once the holds are over: every machine still
there was answered and confirmed (its log says so: a confirmation whose answer the kill cut off
may have landed), every confirmation answered is among them, each runs exactly one process,
and nothing else runs or holds capacity.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from souk.models.api import HOLD_HEADER
from tests.support.machines import live_pids, machine_processes
from tests.support.waiting import wait_until
from tests.support.worker_process import WorkerFactory, WorkerProcess

pytestmark = pytest.mark.integration

HOLD = 3.0
BURST = 16
CONFIG = {
    "init": {"exec": ["sleep", "600"]},
    "guest": {"cpus": 1, "memory_mb": 64},
    "restart": {"policy": "no"},
}


async def create(session: aiohttp.ClientSession, url: str, machine_id: str) -> dict[str, Any]:
    body = {"app": "holds", "id": machine_id, "config": CONFIG}
    headers = {HOLD_HEADER: str(HOLD)}
    async with session.post(f"{url}/v1/machines", json=body, headers=headers) as resp:
        assert resp.status == 201, await resp.text()
        machine: dict[str, Any] = await resp.json()
        return machine


def confirm(worker: WorkerProcess, ids: set[str]) -> dict[str, str]:
    holds: dict[str, str] = worker.ok("POST", "/v1/confirmations", {"ids": sorted(ids)})["holds"]
    return holds


async def burst_then_kill(worker: WorkerProcess) -> tuple[set[str], set[str]]:
    """BURST creates at once; the worker is killed once the first is confirmed. Returns the
    ids that were answered, and those confirmed (the others may or may not have been
    committed)."""
    answered: set[str] = set()
    confirmed: set[str] = set()
    first = asyncio.Event()

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        machine = await create(session, worker.url, f"hold{i:03d}")
        answered.add(machine["id"])
        body = {"ids": [machine["id"]]}
        async with session.post(f"{worker.url}/v1/confirmations", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["holds"] == {machine["id"]: "confirmed"}
        confirmed.add(machine["id"])
        first.set()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [asyncio.create_task(one(session, i)) for i in range(BURST)]
        await asyncio.wait_for(first.wait(), 15)
        worker.kill9()
        await asyncio.gather(*tasks, return_exceptions=True)
    return answered, confirmed


def settled(worker: WorkerProcess) -> list[dict[str, Any]]:
    machines: list[dict[str, Any]] = worker.ok("GET", "/v1/machines")
    return machines


async def test_kill9_mid_burst_leaves_no_unconfirmed_machine(
    spawn_worker: WorkerFactory,
) -> None:
    worker = spawn_worker(cpus=BURST, memory_mb=BURST * 1024)
    answered, confirmed = await burst_then_kill(worker)
    assert confirmed
    worker.start()
    candidates = {f"hold{i:03d}" for i in range(BURST)}

    def confirmed_in_log(machine_id: str) -> bool:
        events = worker.machine(machine_id)["events"]
        return ("hold", "confirmed") in {(e["type"], e.get("step")) for e in events}

    def holds_over() -> bool:
        live = settled(worker)
        cpus = worker.ok("GET", "/v1/capacity")["reserved"]["cpus"]
        return cpus == len(live) and all(confirmed_in_log(m["id"]) for m in live)

    wait_until(holds_over, timeout=HOLD + 15, what="unconfirmed machines destroyed")
    live = {m["id"] for m in settled(worker)}
    assert confirmed <= live <= answered
    for machine_id in live:
        assert worker.wait(machine_id, "started")["state"] == "started"
        assert len(live_pids(machine_id)) == 1, machine_id
    assert machine_processes(candidates - live) == []


def test_an_unconfirmed_machine_is_destroyed_after_a_restart_past_its_deadline(
    worker: WorkerProcess,
) -> None:
    def create_held(machine_id: str) -> dict[str, Any]:
        body = {"app": "holds", "id": machine_id, "config": CONFIG}
        reply = worker.call("POST", "/v1/machines", body, headers={HOLD_HEADER: str(HOLD)})
        assert reply.status == 201, reply
        machine: dict[str, Any] = reply.body
        return machine

    kept, lost = create_held("kept00"), create_held("lost00")
    confirm(worker, {kept["id"]})
    worker.wait(lost["id"], "started")
    assert worker.ok("GET", "/v1/capacity")["reserved"]["cpus"] == 2  # held while provisional
    worker.kill9()
    time.sleep(HOLD)  # the deadline passes while the worker is down
    worker.start()
    assert worker.wait(lost["id"], "destroyed")["state"] == "destroyed"
    assert live_pids(lost["id"]) == []
    assert worker.machine(kept["id"])["state"] == "started"
    assert worker.ok("GET", "/v1/capacity")["reserved"]["cpus"] == 1
    events = [(e["type"], e.get("step")) for e in worker.machine(lost["id"])["events"]]
    assert ("hold", "expired") in events
    assert confirm(worker, {lost["id"], "nosuch0"}) == {lost["id"]: "expired", "nosuch0": "unknown"}

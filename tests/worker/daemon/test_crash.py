"""`kill -9` of a real worker at random points of a stream of creates, starts, stops, restarts and
destroys, then a restart on the same data directory.

What must hold each time: every acknowledged machine is there exactly once, in the state its last
acknowledged operation leads to (or the one an in-flight operation leads to: that may or may not
have landed); each machine that should run has exactly one live process, the one the worker
reports; nothing else runs; no capacity leaked; the database is intact.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from tests.support.machines import api_pid, integrity, live_pids, machine_processes
from tests.support.worker_process import WorkerFactory, WorkerProcess

pytestmark = pytest.mark.integration

SEED = 20251123
ITERATIONS = 6
LANES = 4
MAX_OWNED = 5  # per lane: beyond this a lane destroys rather than creates
GUEST = {"cpus": 1, "memory_mb": 64}
ENDS_IN = {"create": "started", "start": "started", "restart": "started", "stop": "stopped"}
ENDS_IN["destroy"] = "destroyed"


@dataclass
class Tracked:
    id: str
    expect: set[str]  # where it may be found; "absent" while its create may not have landed


@dataclass
class Ledger:
    machines: dict[str, Tracked] = field(default_factory=dict)
    surprises: list[str] = field(default_factory=list)  # answers the model did not allow


def request_for(op: str, machine_id: str) -> tuple[str, str, Any]:
    if op == "create":
        config = {
            "init": {"exec": ["sleep", "600"]},
            "guest": GUEST,
            "restart": {"policy": "no"},
            "stop_config": {"timeout": "2s"},
        }
        return "POST", "/v1/machines", {"app": "chaos", "id": machine_id, "config": config}
    if op == "destroy":
        return "DELETE", f"/v1/machines/{machine_id}?force=true", None
    return "POST", f"/v1/machines/{machine_id}/{op}", {}


async def lane(
    session: aiohttp.ClientSession,
    url: str,
    rng: random.Random,
    owned: list[Tracked],
    ledger: Ledger,
    prefix: str,
) -> None:
    """Operations one after another on this lane's own machines, until the worker dies."""
    serial = 0
    while True:
        if len(owned) < 2 or (len(owned) < MAX_OWNED and rng.random() < 0.3):
            serial += 1
            machine = Tracked(f"{prefix}x{serial:03d}", {"absent"})
            ledger.machines[machine.id] = machine
            owned.append(machine)
            op = "create"
        else:
            machine = rng.choice(owned)
            (state,) = machine.expect
            choices = ["stop", "restart", "destroy"] if state == "started" else ["start", "destroy"]
            op = rng.choice(choices)
        method, path, body = request_for(op, machine.id)
        before = set(machine.expect)
        machine.expect = before | {ENDS_IN[op]}  # in flight: either may be what a crash leaves
        try:
            async with session.request(method, url + path, json=body) as resp:
                answer = await resp.json()
                status = resp.status
        except (aiohttp.ClientError, OSError, TimeoutError):
            return  # the worker is gone; this operation may or may not have been accepted
        if status not in (200, 201):
            ledger.surprises.append(f"{op} {machine.id} in {before}: {status} {answer}")
            return
        machine.expect = {ENDS_IN[op]}
        if op == "destroy":
            owned.remove(machine)


async def settle(worker: WorkerProcess, ledger: Ledger) -> None:
    """Wait for each machine to settle where the model allows; record where it is."""
    listed = worker.ok("GET", "/v1/machines?include_deleted=true")
    counts = Counter(m["id"] for m in listed)
    assert all(n == 1 for n in counts.values()), counts
    for machine in list(ledger.machines.values()):
        if machine.id not in counts:
            assert "absent" in machine.expect, f"acknowledged {machine} is missing"
            del ledger.machines[machine.id]
            continue
        targets = sorted(machine.expect - {"absent"})
        found = None
        for _ in range(100):
            for state in targets:
                path = f"/v1/machines/{machine.id}/wait?state={state}&timeout=0.1"
                if worker.call("GET", path).status == 200:
                    found = state
                    break
            if found:
                break
        current = worker.machine(machine.id)["state"]
        assert found is not None, f"{machine} settled as {current}"
        machine.expect = {found}


def check_processes_and_capacity(worker: WorkerProcess, ledger: Ledger) -> None:
    running = {m.id for m in ledger.machines.values() if m.expect == {"started"}}
    for machine in ledger.machines.values():
        pids = live_pids(machine.id)
        if machine.id in running:
            assert pids == [api_pid(worker.machine(machine.id))], (machine, pids)
        else:
            assert pids == [], (machine, pids)
    assert len(machine_processes(set(ledger.machines))) == len(running)
    present = worker.ok("GET", "/v1/machines")
    capacity = worker.ok("GET", "/v1/capacity")
    assert capacity["reserved"] == {
        "cpus": sum(m["config"]["guest"]["cpus"] for m in present),
        "memory_mb": sum(m["config"]["guest"]["memory_mb"] for m in present),
    }
    assert capacity["machines"] == len(present)
    alive = {m.id for m in ledger.machines.values() if m.expect != {"destroyed"}}
    assert {m["id"] for m in present} == alive


async def test_kill_9_at_random_points(spawn_worker: WorkerFactory) -> None:
    rng = random.Random(SEED)
    worker = spawn_worker(cpus=64, memory_mb=64 * 64)
    ledger = Ledger()
    timeout = aiohttp.ClientTimeout(total=10)
    for iteration in range(ITERATIONS):
        live = [m for m in ledger.machines.values() if m.expect != {"destroyed"}]
        owned: list[list[Tracked]] = [live[i::LANES] for i in range(LANES)]
        async with aiohttp.ClientSession(timeout=timeout) as session:
            lanes = [
                asyncio.create_task(
                    lane(
                        session,
                        worker.url,
                        random.Random(rng.random()),
                        owned[i],
                        ledger,
                        f"m{iteration}l{i}",
                    )
                )
                for i in range(LANES)
            ]
            await asyncio.sleep(rng.uniform(0.02, 0.5))
            worker.kill9()
            await asyncio.gather(*lanes)
        assert not ledger.surprises, ledger.surprises
        assert integrity(worker.db_path) == "ok"
        worker.start()
        await settle(worker, ledger)
        check_processes_and_capacity(worker, ledger)
    assert integrity(worker.db_path) == "ok"
    # The run did exercise something: machines were made, and some are still running.
    assert any(m.expect == {"started"} for m in ledger.machines.values())

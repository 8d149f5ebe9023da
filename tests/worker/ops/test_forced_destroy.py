"""A forced destroy waits behind nothing: what the machine's queue was doing ends where it
stands (logged `superseded`), and a commit that operation's step still sends is refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.engine import Engine
from souk.worker.machines import admission
from souk.worker.machines.operations import MACHINES
from souk.worker.ops.fsm import OPERATIONS
from souk.worker.ops.progress import StepRun, Superseded, advance
from souk.worker.state.operations import MACHINE_QUEUE
from tests.support.waiting import eventually

STUBBORN = {
    "init": {"exec": ["sh", "-c", "trap '' TERM INT; : > ready; while :; do sleep 1; done"]},
    "stop_config": {"timeout": "120s"},
}


async def started(engine: Engine, config: dict[str, Any]) -> str:
    req = CreateMachine(app="demo", config=MachineConfig.model_validate(config), start=True)
    mid = (await engine.create(req, wait=0.5)).id
    ok, _ = await engine.wait(mid, "started", 10, None)
    assert ok
    home = engine.settings.data_dir / "apps" / "demo" / mid
    await eventually((home / "ready").exists)  # its trap set
    return mid


def steps(engine: Engine, mid: str) -> list[str]:
    return [f"{e.type}.{e.step}" for e in reversed(engine.events(mid))]


async def test_a_forced_destroy_ends_a_stop_waiting_out_its_timeout(engine: Engine) -> None:
    mid = await started(engine, STUBBORN)
    await engine.submit(mid, "stop")
    await eventually(lambda: engine.get(mid).state == "stopping")
    await asyncio.sleep(0.1)  # the stop waits in its signal step now

    await engine.submit(mid, "destroy", {"force": True})
    ok, found = await engine.wait(mid, "destroyed", 10, None)  # not the stop's 120 s

    assert ok, found.state
    logged = [s for s in steps(engine, mid) if s != "exit.exit"]  # whenever it died
    assert logged[-7:] == [
        "stop.begin_stop",
        "stop.superseded",
        "destroy.accepted",
        "destroy.begin_destroy",
        "destroy.kill",
        "destroy.cleanup",
        "destroy.end_destroy",
    ]
    assert await engine.drivers.command.remaining(mid, None) == []
    assert engine.capacity().machines == 0


async def test_a_second_forced_destroy_changes_nothing(engine: Engine) -> None:
    mid = await started(engine, STUBBORN)
    await engine.submit(mid, "destroy", {"force": True})
    await engine.submit(mid, "destroy", {"force": True})
    ok, _ = await engine.wait(mid, "destroyed", 10, None)
    assert ok
    assert sum(s == "destroy.accepted" for s in steps(engine, mid)) == 1


async def test_a_superseded_operation_logs_nothing_more(engine: Engine) -> None:
    """What a cancelled step had sent to the writer is refused once its operation is over."""
    req = CreateMachine(app="demo", config=MachineConfig.model_validate(STUBBORN), start=False)
    mid = (await engine.create(req)).id
    start = OPERATIONS["start"]  # queued, its runner not kicked: as if cut short in its step
    await engine.store.write(lambda tx: admission.accept(tx, mid, start, {}, None))
    row = MACHINE_QUEUE.next(engine.store.read, mid)
    assert row is not None and row["op"] == "start"
    await engine.submit(mid, "destroy", {"force": True})
    with pytest.raises(Superseded):
        await advance(engine.store, StepRun(MACHINES, mid, row["id"], start, 0, {}))
    ok, _ = await engine.wait(mid, "destroyed", 10, None)
    assert ok
    assert "start.begin_start" not in steps(engine, mid)

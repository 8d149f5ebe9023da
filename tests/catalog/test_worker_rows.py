"""A real worker engine as an owner: its commits reach a replica as rows, versioned by its log."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from souk.catalog.bus import Faults, InProcessBus
from souk.catalog.owner import Owner
from souk.catalog.replica import Replica
from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, publishing, running
from souk.worker.engine import Engine
from souk.worker.rows import WorkerRows
from tests.catalog.pki import Ca
from tests.support.engines import settings
from tests.support.waiting import eventually


def machine_states(replica: Replica) -> dict[str, str]:
    return {m.id: m.state for m in replica.machines()}


def caught_up(replica: Replica, owner: Owner) -> bool:
    """The replica holds every batch w1's owner has sent. A commit that changed no row a
    replica holds sends none, so the worker's own head may be further on."""
    return replica.head("w1") == owner.published


@contextlib.asynccontextmanager
async def replicated(
    tmp_path: Path, bus: InProcessBus | None = None
) -> AsyncIterator[tuple[Engine, Owner, Replica]]:
    """A sim worker, w1, publishing its rows on the bus, and a replica following them."""
    bus = bus or InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    s = settings(tmp_path)
    try:
        async with (
            running(Engine(s, make_driver("sim", s))) as engine,
            publishing(engine, bus, "http://w1.test") as owner,
        ):
            yield engine, owner, replica
    finally:
        await replica.stop()


async def test_a_workers_machines_and_capacity_replicate(tmp_path: Path) -> None:
    async with replicated(tmp_path) as (engine, owner, replica):
        config = MachineConfig.model_validate({"init": {"exec": ["sleep", "60"]}})
        ids = [(await engine.create(CreateMachine(app="web", config=config))).id for _ in range(3)]
        await eventually(lambda: len(replica.machines(app="web")) == 3)
        worker = replica.worker("w1")
        assert worker is not None and worker.address == "http://w1.test"
        await eventually(lambda: (replica.worker("w1") or worker).machines == 3)
        await engine.submit(ids[0], "destroy", {"force": True})
        await eventually(lambda: machine_states(replica).get(ids[0]) == "destroyed")
        await eventually(lambda: caught_up(replica, owner))
        held = {m.id: m for m in replica.machines(app="web")}
        for mid in ids:
            machine = engine.get(mid, events=False)
            assert held[mid].state == machine.state
            assert held[mid].instance_id == machine.instance_id
        assert replica.regions_of_app("web") == ["mad"]


async def test_a_replica_that_missed_everything_pulls_it(tmp_path: Path) -> None:
    bus = InProcessBus(Faults(drop=1.0))  # nothing gets through at first
    async with replicated(tmp_path, bus) as (engine, owner, replica):
        owner.heartbeat_every = 0.05
        config = MachineConfig.model_validate({"init": {"exec": ["sleep", "60"]}})
        for _ in range(4):
            await engine.create(CreateMachine(app="web", config=config))
        assert replica.machines() == []
        bus.faults = Faults()
        await owner.heartbeat()
        await eventually(lambda: len(replica.machines(app="web")) == 4)
        await eventually(lambda: replica.head("w1") == engine.store.head())


async def test_a_recreated_worker_database_is_a_new_epoch(tmp_path: Path) -> None:
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    config = MachineConfig.model_validate({"init": {"exec": ["sleep", "60"]}})
    s = settings(tmp_path, data_dir=tmp_path / "a")
    async with (
        running(Engine(s, make_driver("sim", s))) as engine,
        publishing(engine, bus, "http://w1.test"),
    ):
        old = (await engine.create(CreateMachine(app="web", config=config))).id
        await eventually(lambda: old in machine_states(replica))
    s = settings(tmp_path, data_dir=tmp_path / "b")  # same name, fresh database
    async with (
        running(Engine(s, make_driver("sim", s))) as engine,
        publishing(engine, bus, "http://w1.test"),
    ):
        new = (await engine.create(CreateMachine(app="web", config=config))).id
        await eventually(lambda: set(machine_states(replica)) == {new})
    assert old not in machine_states(replica)
    await replica.stop()


async def test_a_workers_signed_rows_reach_a_replica_that_checks_them(tmp_path: Path) -> None:
    bus, ca = InProcessBus(), Ca()
    replica = Replica(bus, trust=ca.trust())
    await replica.start(bootstrap=False)
    s = settings(tmp_path)
    config = MachineConfig.model_validate({"init": {"exec": ["sleep", "60"]}})
    async with running(Engine(s, make_driver("sim", s))) as engine:
        rows = WorkerRows(engine, "http://w1.test")
        owner = Owner(bus, rows, signer=ca.node("worker", "w1").signer())
        rows.attach(owner)
        await owner.start()
        made = [(await engine.create(CreateMachine(app="web", config=config))).id for _ in range(3)]
        await engine.submit(made[0], "destroy", {"force": True})
        await eventually(lambda: machine_states(replica).get(made[0]) == "destroyed")
        await eventually(lambda: caught_up(replica, owner))
        assert set(machine_states(replica)) == set(made)
        assert replica.guard.refused == {}
        rows.detach()
        await owner.stop()
    await replica.stop()


async def test_a_commit_that_changes_no_row_a_replica_holds_sends_nothing(tmp_path: Path) -> None:
    """A create's confirmation is logged (the hold ends) but changes no catalog row: no batch
    goes out for it, and the next change still follows on without a pull."""
    async with replicated(tmp_path) as (engine, owner, replica):
        config = MachineConfig.model_validate({"init": {"exec": ["sleep", "60"]}})
        machine = await engine.create(CreateMachine(app="web", config=config), hold=60, wait=5)
        await eventually(lambda: machine_states(replica).get(machine.id) == "started")
        await eventually(lambda: replica.head("w1") == owner.published == engine.store.head())
        sent, head = owner.batches, engine.store.head()
        gaps, pulls = replica.stats["gaps"], replica.stats["pulls"]  # the first catch-up's

        assert await engine.confirm([machine.id]) == {machine.id: "confirmed"}
        assert engine.store.head() > head and engine.provisional_until(machine.id) is None
        await asyncio.sleep(0.1)
        assert owner.batches == sent and replica.head("w1") == head

        await engine.submit(machine.id, "stop", {})
        await eventually(lambda: machine_states(replica).get(machine.id) == "stopped")
        await eventually(lambda: caught_up(replica, owner))
        assert (replica.stats["gaps"], replica.stats["pulls"]) == (gaps, pulls)


async def test_a_replica_that_caught_up_from_the_worker_holds_its_destroyed_machines(
    tmp_path: Path,
) -> None:
    """A destroyed machine is a row every replica shows, not a tombstone: one that pulls the
    worker's rows from nothing holds it too, or a snapshot it serves leaves it out while its
    heads say it is there, and the replica that bootstraps from it never asks for it again."""
    bus = InProcessBus()
    first = Replica(bus)
    await first.start(bootstrap=False)
    s = settings(tmp_path)
    config = MachineConfig.model_validate({"init": {"exec": ["sleep", "60"]}})
    async with (
        running(Engine(s, make_driver("sim", s))) as engine,
        publishing(engine, bus, "http://w1.test") as owner,
    ):
        made = [(await engine.create(CreateMachine(app="web", config=config))).id for _ in range(3)]
        await engine.submit(made[0], "destroy", {"force": True})
        await eventually(lambda: machine_states(first).get(made[0]) == "destroyed")
        await eventually(lambda: caught_up(first, owner))
        truth = {m.id: m.state for m in engine.machines(include_destroyed=True)}
        assert machine_states(first) == truth

        late = Replica(bus)  # no snapshot: all it holds, it pulled from the worker since 0
        await late.start(bootstrap=False)
        await eventually(lambda: caught_up(late, owner))
        assert machine_states(late) == truth

        await first.stop()  # the late replica is the one left to answer a snapshot request
        fresh = Replica(bus)
        await fresh.start()
        assert fresh.stats["snapshots_loaded"] == 1
        await eventually(lambda: caught_up(fresh, owner))
        assert machine_states(fresh) == truth
        await late.stop()
        await fresh.stop()

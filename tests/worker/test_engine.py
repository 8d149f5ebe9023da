"""The engine in-process: real store, real processes (or the sim driver), no HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, running
from souk.worker.drivers.base import Launch
from souk.worker.drivers.process import ProcessDriver
from souk.worker.engine import Engine
from souk.worker.errors import WorkerError
from souk.worker.host import procfs
from souk.worker.host.cgroups import Cgroups
from souk.worker.http import http_error
from souk.worker.state.store import Commit
from tests.support.engines import destroy_all, settings
from tests.support.waiting import eventually


def request(argv: list[str], **config: object) -> CreateMachine:
    return CreateMachine(app="demo", config=MachineConfig(init={"exec": argv}, **config))  # type: ignore[arg-type]


async def started(engine: Engine, machine_id: str, timeout: float = 10) -> int:
    ok, machine = await engine.wait(machine_id, "started", timeout, None)
    assert ok, machine.state
    row = engine.store.read.execute(
        "SELECT pid FROM machines WHERE id = ?", (machine_id,)
    ).fetchone()
    return int(row["pid"])


def alive(pid: int) -> bool:
    return procfs.start_time(pid) is not None


def consistent(db: Path) -> None:
    """The capacity counters equal the sum of what live machines hold."""
    conn = sqlite3.connect(db)
    sums = conn.execute(
        "SELECT COALESCE(SUM(cpus),0), COALESCE(SUM(memory_mb),0), COUNT(*) FROM machines"
        " WHERE reserved = 1"
    ).fetchone()
    assert sums == conn.execute("SELECT cpus, memory_mb, machines FROM capacity").fetchone()
    conn.close()


async def test_lifecycle_create_stop_start_destroy(engine: Engine) -> None:
    m = await engine.create(request(["sleep", "30"]))
    assert m.state == "created"
    pid = await started(engine, m.id)
    assert alive(pid)
    assert engine.capacity().reserved.cpus == 1

    await engine.submit(m.id, "stop", {"signal": "SIGTERM"})
    assert (await engine.wait(m.id, "stopped", 10, None))[0]
    assert not alive(pid)
    assert engine.capacity().reserved.cpus == 1  # a stopped machine keeps its reservation

    await engine.submit(m.id, "start")
    pid2 = await started(engine, m.id)
    assert pid2 != pid and alive(pid2)

    await engine.submit(m.id, "destroy", {"force": True})
    assert (await engine.wait(m.id, "destroyed", 10, None))[0]
    assert not alive(pid2)
    assert engine.capacity().reserved.cpus == 0
    assert not engine.settings.rundir(m.id).exists()
    steps = [f"{e.type}.{e.step}" for e in reversed(engine.events(m.id))]
    assert steps[:4] == ["launch.reserve", "start.accepted", "start.begin_start", "start.spawn"]
    assert steps[-1] == "destroy.end_destroy"
    consistent(engine.settings.db_path)


async def test_destroying_a_running_machine_needs_force(engine: Engine) -> None:
    m = await engine.create(request(["sleep", "30"]))
    await started(engine, m.id)
    with pytest.raises(WorkerError) as raised:
        await engine.submit(m.id, "destroy", {"force": False})
    answer = http_error(raised.value)
    assert answer.http_status == 409 and answer.reason == "invalid_state"
    await engine.submit(m.id, "destroy", {"force": True})
    assert (await engine.wait(m.id, "destroyed", 10, None))[0]


async def test_restart_gives_a_new_process(engine: Engine) -> None:
    m = await engine.create(request(["sleep", "30"]))
    pid = await started(engine, m.id)
    await engine.submit(m.id, "restart")
    await asyncio.sleep(0)
    for _ in range(200):
        new = await started(engine, m.id)
        if new != pid:
            break
        await asyncio.sleep(0.05)
    assert new != pid and alive(new) and not alive(pid)
    await engine.submit(m.id, "destroy", {"force": True})


async def test_stop_escalates_to_sigkill_after_the_timeout(engine: Engine) -> None:
    m = await engine.create(
        request(["sh", "-c", "trap '' INT TERM; sleep 30"], stop_config={"timeout": "300ms"})
    )
    pid = await started(engine, m.id)
    await engine.submit(m.id, "stop", {"signal": "SIGTERM"})
    assert (await engine.wait(m.id, "stopped", 10, None))[0]
    assert not alive(pid)
    assert any((e.type, e.step) == ("stop", "signal") for e in engine.events(m.id))


@pytest.mark.parametrize(
    ("policy", "argv", "final", "restarts"),
    [
        ({"policy": "no"}, ["sh", "-c", "exit 3"], "stopped", 0),
        ({"policy": "on-failure", "max_retries": 2}, ["sh", "-c", "exit 3"], "failed", 2),
        ({"policy": "on-failure", "max_retries": 5}, ["true"], "stopped", 0),
        ({"policy": "always"}, ["true"], None, 3),
    ],
)
async def test_restart_policies(
    engine: Engine, policy: dict[str, object], argv: list[str], final: str | None, restarts: int
) -> None:
    m = await engine.create(request(argv, restart=policy))
    for _ in range(400):
        machine = engine.get(m.id, events=False)
        if final is None and machine.restart_count >= restarts:
            break
        if final is not None and machine.state == final and not _pending(engine, m.id):
            break
        await asyncio.sleep(0.025)
    machine = engine.get(m.id, events=False)
    if final is None:
        assert machine.restart_count >= restarts
    else:
        assert (machine.state, machine.restart_count) == (final, restarts)
        assert machine.exit_code == (0 if argv == ["true"] else 3)
    await engine.submit(m.id, "destroy", {"force": True})
    assert (await engine.wait(m.id, "destroyed", 10, None))[0]


def _pending(engine: Engine, machine_id: str) -> bool:
    row = engine.store.read.execute(
        "SELECT 1 FROM operations WHERE machine = ? AND done = 0", (machine_id,)
    ).fetchone()
    return row is not None


async def test_reservations_never_overcommit(sim_engine: Engine) -> None:
    """Four cpus, sixty concurrent one-cpu creates: exactly four fit, the rest are refused."""
    results = await asyncio.gather(
        *(sim_engine.create(request(["x"])) for _ in range(60)), return_exceptions=True
    )
    accepted = [r for r in results if not isinstance(r, BaseException)]
    refused = [http_error(r) for r in results if isinstance(r, WorkerError)]
    assert len(accepted) == 4 and len(refused) == 56
    assert all(r.http_status == 412 and r.reason == "insufficient_capacity" for r in refused)
    assert refused[0].details is not None and refused[0].details["free"]["cpus"] == 0
    assert sim_engine.capacity().free.cpus == 0
    consistent(sim_engine.settings.db_path)


async def test_cordoned_worker_refuses_new_machines(sim_engine: Engine) -> None:
    await sim_engine.set_cordoned(True)
    with pytest.raises(WorkerError) as err:
        await sim_engine.create(request(["x"]))
    assert err.value.reason == "cordoned"
    await sim_engine.set_cordoned(False)
    assert (await sim_engine.create(request(["x"]))).state == "created"


async def test_update_in_place_changes_instance_and_reservation(sim_engine: Engine) -> None:
    m = await sim_engine.create(request(["x"]))
    await started(sim_engine, m.id)
    bigger = MachineConfig(init={"exec": ["y"]}, guest={"cpus": 3})  # type: ignore[arg-type]
    await sim_engine.update(m.id, bigger)
    for _ in range(200):
        now = sim_engine.get(m.id, events=False)
        if now.instance_id != m.instance_id and now.state == "started":
            break
        await asyncio.sleep(0.01)
    assert now.instance_id != m.instance_id and now.config.init.exec == ["y"]
    assert sim_engine.capacity().reserved.cpus == 3
    too_big = MachineConfig(init={"exec": ["y"]}, guest={"cpus": 5})  # type: ignore[arg-type]
    with pytest.raises(WorkerError) as raised:
        await sim_engine.update(m.id, too_big)
    assert http_error(raised.value).http_status == 412
    assert sim_engine.capacity().reserved.cpus == 3


async def test_group_commit_shares_transactions(sim_engine: Engine) -> None:
    commits: list[int] = []
    sim_engine.store.listeners.append(lambda c: commits.append(c.last_seq))
    await asyncio.gather(*(sim_engine.create(request(["x"], guest={"memory_mb": 16}))
                           for _ in range(4)))  # fmt: skip
    await asyncio.gather(*(sim_engine.set_cordoned(False) for _ in range(50)))
    assert 0 < len(commits) < 54


async def test_wait_times_out_with_the_current_state(sim_engine: Engine) -> None:
    m = await sim_engine.create(CreateMachine(app="demo", config=MachineConfig(
        init={"exec": ["x"]}), start=False))  # type: ignore[arg-type]  # fmt: skip
    ok, machine = await sim_engine.wait(m.id, "started", 0.05, None)
    assert not ok and machine.state == "created"


async def test_a_queued_operation_resumes_after_a_crash(tmp_path: Path) -> None:
    """Close the engine right after acknowledging a create+start: the next one finishes it."""
    s = settings(tmp_path)
    engine = Engine(s, make_driver("process", s))
    await engine.recover()
    m = await engine.create(request(["sleep", "30"]))
    await engine.close()  # as if killed: the start operation is logged but not run
    assert m.state == "created"

    async with running(Engine(s, make_driver("process", s))) as again:
        pid = await started(again, m.id)
        assert alive(pid)
        await again.submit(m.id, "destroy", {"force": True})
        assert (await again.wait(m.id, "destroyed", 10, None))[0]


async def test_a_restarted_worker_adopts_its_processes(tmp_path: Path) -> None:
    s = settings(tmp_path)
    engine = Engine(s, make_driver("process", s))
    await engine.recover()
    m = await engine.create(request(["sleep", "30"], restart={"policy": "always"}))
    pid = await started(engine, m.id)
    await engine.close()  # the process lives on without its worker
    assert alive(pid)

    async with running(Engine(s, make_driver("process", s))) as again:
        assert (await started(again, m.id)) == pid  # adopted, not started twice
        assert any((e.type, e.step) == ("start", "spawn") for e in again.events(m.id))
        os.killpg(pid, signal.SIGKILL)  # the adopted process dies: policy `always` restarts it
        for _ in range(200):
            if again.get(m.id, events=False).restart_count == 1:
                break
            await asyncio.sleep(0.02)
        new = await started(again, m.id)
        assert new != pid and alive(new)
        await again.submit(m.id, "destroy", {"force": True})
        assert (await again.wait(m.id, "destroyed", 10, None))[0]


async def test_only_a_resumed_spawn_looks_for_a_copy_an_earlier_run_started(
    tmp_path: Path,
) -> None:
    config = MachineConfig(init={"exec": ["sleep", "30"]})  # type: ignore[arg-type]
    launch = Launch("m1", "demo", "mad", "i1", config, "m1.7", tmp_path / "m1", "127.0.0.1")
    other = replace(launch, machine_id="m2", resumed=False)
    earlier_run = ProcessDriver(Cgroups("souk/t"))
    first = await earlier_run.spawn(replace(launch, resumed=False))
    later_run = ProcessDriver(Cgroups("souk/t"))  # a new worker run's driver, the step resumed
    found = await later_run.spawn(launch)
    fresh = await later_run.spawn(other)
    try:
        assert found == first
        assert fresh.pid != first.pid and alive(fresh.pid)
    finally:
        for pid in (first.pid, fresh.pid):
            os.killpg(pid, signal.SIGKILL)
        for pid in (first.pid, fresh.pid):  # gone, so that their groups can go too
            await eventually(lambda p=pid: not alive(p))
        for each in (launch, other):
            await later_run.cleanup(each)
        for driver in (earlier_run, later_run):
            await driver.close()


async def test_a_command_that_cannot_run_fails_the_machine(engine: Engine) -> None:
    m = await engine.create(request(["/nonexistent/command"]))
    ok, machine = await engine.wait(m.id, "failed", 10, None)
    assert ok, machine.state
    errors = [e for e in engine.events(m.id) if (e.type, e.step) == ("start", "error")]
    assert errors and "nonexistent" in errors[0].request["error"]
    assert engine.capacity().reserved.cpus == 1  # failed, not destroyed: still reserved


async def test_a_create_that_waits_answers_started_after_one_durable_commit(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path, durable=True)
    async with running(Engine(s, make_driver("process", s))) as engine:
        try:
            await engine.create(request(["sleep", "30"]), wait=5)  # the app's first: its user
            commits: list[Commit] = []
            engine.store.listeners.append(commits.append)
            m = await engine.create(request(["sleep", "30"]), wait=5)
            assert m.state == "started" and not engine.store.unsynced
            await asyncio.sleep(0.01)
            (commit,) = commits  # the create was announced with the spawn, durable together
            steps = engine.store.read.execute(
                "SELECT op, step FROM oplog WHERE resource = ? AND seq BETWEEN ? AND ?",
                (m.id, commit.first_seq, commit.last_seq),
            ).fetchall()
            assert [tuple(r) for r in steps] == [
                ("create", "reserve"),
                ("start", "accepted"),
                ("start", "begin_start"),
                ("start", "spawn"),
            ]
            assert alive(await started(engine, m.id, 0))
            # Without time to wait for the start, the answer still waits for the create's fsync.
            late = await engine.create(request(["sleep", "30"]), wait=1e-6)
            assert late.state in ("created", "starting", "started")
            assert not engine.store.unsynced
            await started(engine, late.id)
        finally:
            await destroy_all(engine)


async def test_a_create_that_fails_to_start_answers_failed(engine: Engine) -> None:
    m = await engine.create(request(["/nonexistent/command"]), wait=5)
    assert m.state == "failed"

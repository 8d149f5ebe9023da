"""A create with `start: true` is committed without an fsync of its own, durable with its spawn's
commit (fsm.py's `CREATE_SYNCED_BY`). A worker killed with -9 between the spawn and that commit
leaves a process its log does not name yet: the restarted worker must adopt it (by its marker),
not start a second copy, and not leave it running unknown."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import souk
from souk.worker.drivers import launcher
from souk.worker.host import procfs
from tests.support.machines import api_pid, is_running, live_pids
from tests.support.worker_process import WorkerFactory

pytestmark = pytest.mark.integration

# A worker (the real engine, store and process driver) that stops between its spawn and the
# spawn's commit, and says which process it spawned: the test kills it there.
STALLING_WORKER = """
import asyncio, sys
from pathlib import Path
from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.host.cgroups import Cgroups
from souk.worker.daemon import make_driver
from souk.worker.drivers.process import ProcessDriver
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings

class Stalls(ProcessDriver):
    async def spawn(self, launch):
        handle = await super().spawn(launch)
        print(launch.machine_id, handle.pid, flush=True)
        await asyncio.Event().wait()  # the spawn's commit never comes

async def main():
    s = WorkerSettings(name="w1", region="mad", data_dir=Path(sys.argv[1]), cpus=8,
                       memory_mb=8192)
    drivers = make_driver("process", s)
    drivers.command = Stalls(Cgroups("souk/w1"))
    engine = Engine(s, drivers)
    await engine.recover()
    config = MachineConfig.model_validate({"init": {"exec": ["sleep", "600"]},
                                           "restart": {"policy": "no"}})
    await engine.create(CreateMachine(app="demo", config=config), wait=60)

asyncio.run(main())
"""


def launch_servers(worker: int) -> list[int]:
    """The `souk-launch --serve` the worker `worker` runs."""
    if launcher.LAUNCHER is None:
        return []
    return [pid for pid in procfs.children(worker) if procfs.program(pid) == launcher.LAUNCHER]


def test_a_worker_killed_between_a_spawn_and_its_commit_adopts_the_process(
    tmp_path: Path, spawn_worker: WorkerFactory
) -> None:
    data_dir = tmp_path / "w1"  # where spawn_worker's first worker keeps its data
    src = str(Path(souk.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    stalling = subprocess.Popen(
        [sys.executable, "-c", STALLING_WORKER, str(data_dir)],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert stalling.stdout is not None
        line = stalling.stdout.readline().decode().split()
        assert line, "the stalling worker spawned nothing"
        machine_id, pid = line[0], int(line[1])
        servers = launch_servers(stalling.pid)
        stalling.kill()  # kill -9, between the spawn and its commit
        stalling.wait()
    finally:
        if stalling.poll() is None:
            stalling.kill()
            stalling.wait()
    assert is_running(pid) and live_pids(machine_id) == [pid]
    assert len(servers) == (launcher.LAUNCHER is not None)
    deadline = time.monotonic() + 10
    while any(is_running(server) for server in servers):  # it ends with its worker
        assert time.monotonic() < deadline, "souk-launch --serve outlived its worker"
        time.sleep(0.01)
    db = sqlite3.connect(f"file:{data_dir / 'worker.db'}?mode=ro", uri=True)
    logged = [r[0] for r in db.execute("SELECT step FROM oplog WHERE resource = ?", (machine_id,))]
    state = db.execute("SELECT state FROM machines WHERE id = ?", (machine_id,)).fetchone()
    db.close()
    # The deferred create outlived the kill (the kernel had it); the spawn was never logged.
    assert state == ("created",) and "spawn" not in logged, logged

    worker = spawn_worker()  # the same data directory, a real `souk worker`
    assert worker.data_dir == data_dir
    machine = worker.wait(machine_id, "started")
    assert api_pid(machine) == pid  # adopted: the process it spawned, not a second copy
    assert live_pids(machine_id) == [pid]
    spawns = [e for e in machine["events"] if e["step"] == "spawn"]
    assert len(spawns) == 1
    worker.ok("DELETE", f"/v1/machines/{machine_id}?force=true")
    worker.wait(machine_id, "destroyed")
    assert live_pids(machine_id) == []

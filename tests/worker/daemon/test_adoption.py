"""A worker killed with -9 while its machines run: they keep running, the restarted worker adopts
them (no second copy) and still notices when they exit."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from tests.support.machines import api_pid, is_running, live_pids
from tests.support.worker_process import WorkerProcess

pytestmark = pytest.mark.integration


def sleeper(policy: str) -> dict[str, Any]:
    return {"init": {"exec": ["sleep", "600"]}, "restart": {"policy": policy, "max_retries": 3}}


def the_pid(worker: WorkerProcess, machine_id: str) -> int:
    pid = api_pid(worker.machine(machine_id))
    assert pid is not None and live_pids(machine_id) == [pid]
    return pid


def spawns(worker: WorkerProcess, machine_id: str) -> int:
    return sum(1 for e in worker.machine(machine_id)["events"] if e["step"] == "spawn")


def until(check: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_adopted_processes_are_supervised_after_a_crash(worker: WorkerProcess) -> None:
    keep = worker.create(sleeper("on-failure"))["id"]  # restarted when it dies
    leave = worker.create(sleeper("no"))["id"]  # left stopped when it dies
    gone = worker.create(sleeper("on-failure"))["id"]  # dies while the worker is down
    for mid in (keep, leave, gone):
        worker.wait(mid, "started")
    pids = {mid: the_pid(worker, mid) for mid in (keep, leave, gone)}

    worker.kill9()
    assert all(is_running(pid) for pid in pids.values())  # they outlive their worker
    os.kill(pids[gone], signal.SIGKILL)
    until(lambda: not is_running(pids[gone]))
    worker.start()

    # The survivors are the same processes, adopted, not started again.
    for mid in (keep, leave):
        assert worker.machine(mid)["state"] == "started"
        assert the_pid(worker, mid) == pids[mid]
        assert spawns(worker, mid) == 1
    # The one that died meanwhile was noticed at start-up and restarted, once.
    until(lambda: worker.machine(gone)["restart_count"] == 1)
    worker.wait(gone, "started")
    assert the_pid(worker, gone) != pids[gone]

    # Exits of adopted processes are noticed too; their exit code cannot be known.
    os.kill(pids[leave], signal.SIGKILL)
    os.kill(pids[keep], signal.SIGKILL)
    stopped = worker.wait(leave, "stopped")
    assert stopped["restart_count"] == 0 and stopped["exit_code"] is None
    assert live_pids(leave) == []
    until(lambda: worker.machine(keep)["restart_count"] == 1)
    worker.wait(keep, "started")
    again = the_pid(worker, keep)
    assert again != pids[keep] and spawns(worker, keep) == 2
    capacity = worker.ok("GET", "/v1/capacity")
    assert capacity["reserved"] == {"cpus": 3, "memory_mb": 768} and capacity["machines"] == 3

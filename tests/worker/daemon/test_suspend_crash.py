"""A suspended machine outlives a `kill -9` of its worker: its processes stay frozen, and the
restarted worker still shows it suspended (no reconciliation to another state), adopts the same
process, and a start thaws it."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from tests.support.machines import api_pid, is_running, live_pids
from tests.support.worker_process import WorkerProcess

pytestmark = pytest.mark.integration


def freezer_state(machine_id: str) -> str | None:
    """The machine's v1 freezer state, where the host has that hierarchy."""
    found = glob.glob(f"/sys/fs/cgroup/freezer/souk/*/{machine_id}/freezer.state")
    return Path(found[0]).read_text().strip() if found else None


def test_a_suspended_machine_stays_suspended_across_a_worker_crash(worker: WorkerProcess) -> None:
    mid = worker.create({"init": {"exec": ["sleep", "600"]}})["id"]
    worker.wait(mid, "started")
    pid = api_pid(worker.machine(mid))
    assert pid is not None and live_pids(mid) == [pid]
    worker.ok("POST", f"/v1/machines/{mid}/suspend")
    worker.wait(mid, "suspended")
    frozen = freezer_state(mid)
    assert frozen in (None, "FROZEN")

    worker.kill9()
    assert is_running(pid)
    worker.start()

    after = worker.machine(mid)
    assert after["state"] == "suspended" and api_pid(after) == pid
    assert freezer_state(mid) == frozen  # still frozen: nothing thawed it meanwhile
    capacity = worker.ok("GET", "/v1/capacity")
    assert capacity["machines"] == 1 and capacity["reserved"]["cpus"] == 1

    worker.ok("POST", f"/v1/machines/{mid}/start")
    resumed = worker.wait(mid, "started")
    assert api_pid(resumed) == pid and live_pids(mid) == [pid]
    assert sum(e.get("step") == "spawn" for e in resumed["events"]) == 1
    if frozen is not None:
        assert freezer_state(mid) == "THAWED"

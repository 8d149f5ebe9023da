"""A machine's life through a real worker process: its process really starts and really goes,
and each restart policy does what it says when the command exits on its own."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.machines import api_pid, is_running, live_pids
from tests.support.worker_process import WorkerProcess

pytestmark = pytest.mark.integration

LOOP = {
    "init": {"exec": [sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"]},
    "restart": {"policy": "no"},
    "stop_config": {"timeout": "5s"},
}


def spawns(machine: dict[str, Any]) -> int:
    return sum(1 for e in machine["events"] if e["step"] == "spawn")


def running_pid(worker: WorkerProcess, machine_id: str) -> int:
    """The machine's one live process, which must be the one the worker reports."""
    pid = api_pid(worker.machine(machine_id))
    assert pid is not None and is_running(pid)
    assert live_pids(machine_id) == [pid]
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"SOUK_MACHINE_ID={machine_id}".encode() in environ
    return pid


def test_create_start_stop_restart_destroy(worker: WorkerProcess) -> None:
    created = worker.create(LOOP)
    mid = created["id"]
    assert created["state"] == "started"  # the create answers once its machine runs
    assert worker.ok("GET", "/v1/capacity")["reserved"] == {"cpus": 1, "memory_mb": 256}

    assert worker.wait(mid, "started")["state"] == "started"
    first = running_pid(worker, mid)

    worker.ok("POST", f"/v1/machines/{mid}/stop", {"timeout": "2s"})
    assert worker.wait(mid, "stopped")["state"] == "stopped"
    assert not is_running(first) and live_pids(mid) == []
    # A stopped machine keeps its reservation: it can start again at once.
    assert worker.ok("GET", "/v1/capacity")["reserved"] == {"cpus": 1, "memory_mb": 256}

    worker.ok("POST", f"/v1/machines/{mid}/start")
    worker.wait(mid, "started")
    second = running_pid(worker, mid)
    assert second != first

    worker.ok("POST", f"/v1/machines/{mid}/restart")
    worker.wait(mid, "started")
    third = running_pid(worker, mid)
    assert third != second and not is_running(second)
    assert worker.machine(mid)["restart_count"] == 0  # asked for: not a crash restart

    refused = worker.call("DELETE", f"/v1/machines/{mid}")
    assert refused.status == 409 and refused.body["code"] == "invalid_state"
    assert is_running(third)

    worker.ok("DELETE", f"/v1/machines/{mid}?force=true")
    assert worker.wait(mid, "destroyed")["state"] == "destroyed"
    assert not is_running(third) and live_pids(mid) == []
    assert mid not in [m["id"] for m in worker.ok("GET", "/v1/machines")]
    capacity = worker.ok("GET", "/v1/capacity")
    assert capacity["reserved"] == {"cpus": 0, "memory_mb": 0} and capacity["machines"] == 0


def crashing(policy: str, code: int, max_retries: int = 10) -> dict[str, Any]:
    return {
        "init": {"exec": ["sh", "-c", f"exit {code}"]},
        "restart": {"policy": policy, "max_retries": max_retries},
    }


def test_policy_no_leaves_a_crashed_machine_stopped(worker: WorkerProcess) -> None:
    mid = worker.create(crashing("no", 3))["id"]
    machine = worker.wait(mid, "stopped")
    assert machine["exit_code"] == 3 and machine["restart_count"] == 0
    time.sleep(0.3)  # long past the first backoff steps: a restart would have happened
    machine = worker.machine(mid)
    assert machine["state"] == "stopped" and machine["restart_count"] == 0
    assert spawns(machine) == 1


def test_policy_on_failure_restarts_up_to_max_retries_then_fails(worker: WorkerProcess) -> None:
    mid = worker.create(crashing("on-failure", 3, max_retries=2))["id"]
    machine = worker.wait(mid, "failed")
    assert machine["restart_count"] == 2 and machine["exit_code"] == 3
    assert spawns(machine) == 3  # the first run and two restarts
    time.sleep(0.3)
    machine = worker.machine(mid)
    assert machine["state"] == "failed" and spawns(machine) == 3
    # Nothing runs, so destroying it needs no force.
    worker.ok("DELETE", f"/v1/machines/{mid}")
    worker.wait(mid, "destroyed")


def test_policy_on_failure_leaves_a_clean_exit_alone(worker: WorkerProcess) -> None:
    mid = worker.create(crashing("on-failure", 0))["id"]
    machine = worker.wait(mid, "stopped")
    assert machine["exit_code"] == 0 and machine["restart_count"] == 0


def test_policy_always_restarts_even_a_clean_exit(worker: WorkerProcess) -> None:
    mid = worker.create(crashing("always", 0))["id"]
    deadline = time.monotonic() + 15
    machine = worker.machine(mid)
    while machine["restart_count"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
        machine = worker.machine(mid)
    assert machine["restart_count"] >= 3 and machine["exit_code"] == 0
    worker.ok("POST", f"/v1/machines/{mid}/stop")
    machine = worker.wait(mid, "stopped")
    count = machine["restart_count"]
    time.sleep(0.5)  # a stopped machine is not restarted, whatever its policy
    machine = worker.machine(mid)
    assert machine["state"] == "stopped" and machine["restart_count"] == count
    assert live_pids(mid) == []

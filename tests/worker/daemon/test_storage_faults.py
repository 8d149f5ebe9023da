"""A data directory that fills up, or cannot be written at all: acknowledged operations wait and
then complete by themselves, requests that need a write are told why (507), and a worker that
cannot use its data directory says so in one line instead of a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.disks import fill, needs_mount, remount_read_only, tmpfs
from tests.support.machines import live_pids
from tests.support.waiting import wait_until
from tests.support.worker_process import WorkerProcess

# Ignores the stop signal, so that a stop waits out its timeout: time to fill the disk between
# the stop's first step and its next.
STUBBORN = {
    "init": {"exec": ["sh", "-c", "trap '' INT; while :; do sleep 1; done"]},
    "restart": {"policy": "no"},
}


def run_worker(data_dir: Path, log: Path) -> subprocess.CompletedProcess[str]:
    """`souk worker` on that data dir, expected to refuse it and exit."""
    argv = WorkerProcess(data_dir, log).argv()
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@needs_mount
def test_an_operation_waits_out_a_full_disk_and_completes(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "data", "size=16m") as data:
        worker = WorkerProcess(data, tmp_path / "w1.log")
        try:
            worker.start()
            mid = worker.create(STUBBORN)["id"]
            idle = worker.create(STUBBORN, start=False)["id"]
            worker.wait(mid, "started")
            worker.ok("POST", f"/v1/machines/{mid}/stop", {"timeout": 3})
            wait_until(lambda: worker.machine(mid)["state"] == "stopping", 10, "stopping")

            filler = fill(data)
            refused = worker.call("POST", "/v1/machines", {"app": "demo", "config": STUBBORN})
            assert refused.status == 507, refused
            assert refused.body["code"] == "insufficient_storage"
            details = refused.body["details"]
            assert details["free_bytes"] < details["needed_bytes"]
            assert worker.call("POST", f"/v1/machines/{idle}/start").status == 507
            assert worker.machine(idle)["state"] == "created"  # reads still answer

            # The stop's signal step kills the process after its timeout, then cannot commit.
            wait_until(lambda: not live_pids(mid), 20, "the stubborn process killed")
            wait_until(
                lambda: worker.ok("GET", "/v1/status")["storage"]["stalled_operations"] == 1,
                10,
                "the stop waiting for the disk",
            )
            status = worker.ok("GET", "/v1/status")["storage"]
            assert (status["writable"], status["reason"]) == (False, "insufficient_storage")
            wait_until(lambda: worker.machine(mid)["state"] == "stopping", 10, "stopping")

            filler.unlink()
            stopped = worker.wait(mid, "stopped", timeout=20)  # with no request to wake it
            steps = [
                f"{e['type']}.{e['step']}"
                for e in reversed(stopped["events"])
                if e["type"] == "stop"
            ]
            assert steps == ["stop.accepted", "stop.begin_stop", "stop.signal", "stop.end_stop"]
            assert worker.ok("GET", "/v1/status")["storage"]["writable"] is True
            worker.ok("POST", f"/v1/machines/{idle}/start")
            worker.wait(idle, "started")
        finally:
            worker.close()


@needs_mount
def test_a_read_only_data_dir_is_one_line_and_an_exit(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "used", "size=16m") as used, tmpfs(tmp_path / "fresh", "size=1m,ro"):
        worker = WorkerProcess(used, tmp_path / "w1.log")
        try:
            worker.start()  # leaves its database there
        finally:
            worker.kill9()  # it ran no machine (and `close` would leave a reader open here)
        remount_read_only(used)
        for data_dir in (used, tmp_path / "fresh", tmp_path / "fresh" / "missing"):
            done = run_worker(data_dir, tmp_path / "ro.log")
            assert done.returncode != 0
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1, done.stderr
            assert str(data_dir) in lines[0] and "read-only" in lines[0], lines


def test_a_data_dir_that_cannot_be_made_is_one_line_and_an_exit(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory\n")
    for data_dir in (tmp_path / "file", tmp_path / "file" / "below"):
        done = run_worker(data_dir, tmp_path / "w.log")
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"souk worker: data dir {data_dir}:"), lines
        assert "not a directory" in lines[0], lines

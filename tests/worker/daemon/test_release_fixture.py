"""Data written by the previous release (tests/fixtures/release-*, see write_release_fixture.py),
opened by today's `souk worker`: every machine still there, in the state it rested in, its
metadata and events intact; and a backup taken while a worker creates machines restores to a
worker that finds them all."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from souk.schema import version_of
from souk.worker.state.schema import WORKER_SCHEMA
from tests.support.worker_process import SOUK, WorkerProcess

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parents[2] / "fixtures" / "release-c03bc63"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text())


def fixture_worker(tmp_path: Path, name: str) -> WorkerProcess:
    data = tmp_path / name
    data.mkdir(mode=0o700)
    shutil.copyfile(FIXTURE / f"{name}.db", data / "worker.db")
    return WorkerProcess(data, tmp_path / f"{name}.log", name=name)


@pytest.mark.parametrize("name", sorted(set(EXPECTED["workers"].values())))
def test_a_previous_releases_worker_opens_with_every_machine(tmp_path: Path, name: str) -> None:
    worker = fixture_worker(tmp_path, name)
    before = sqlite3.connect(worker.db_path)
    events_before = dict(
        before.execute("SELECT resource, count(*) FROM oplog GROUP BY resource").fetchall()
    )
    before.close()
    try:
        worker.start()
        listed = {m["id"]: m for m in worker.ok("GET", "/v1/machines")}
        held = {mid for mid, w in EXPECTED["workers"].items() if w == name}
        alive = held - {EXPECTED["destroyed"]}
        assert alive <= set(listed), "a machine of the release is missing"
        for mid, state in EXPECTED["machines"].items():
            if mid not in held:
                continue
            machine = worker.machine(mid)
            assert machine["config"]["metadata"]["made"] == state
            # Its history is all there, whatever today's worker did with it since.
            assert len(machine["events"]) >= min(events_before[mid], 1)
            if state == "stopped":
                assert machine["state"] == "stopped"
            else:  # its process did not outlive the release's host: noticed, not lost
                assert machine["state"] in (state, "started", "stopped", "failed")
        if EXPECTED["destroyed"] in held:
            reply = worker.call("GET", f"/v1/machines/{EXPECTED['destroyed']}")
            assert reply.status == 404 or reply.body["state"] == "destroyed"
        conn = sqlite3.connect(worker.db_path)
        assert version_of(conn) == WORKER_SCHEMA.version
        conn.close()
        assert (worker.data_dir / "worker.db.v0.bak").exists()
    finally:
        worker.close()


def test_a_backup_taken_under_load_restores_every_machine(tmp_path: Path) -> None:
    worker = WorkerProcess(tmp_path / "w1", tmp_path / "w1.log", cpus=16)
    worker.start()
    made: list[str] = []
    try:
        for _ in range(3):
            made.append(worker.create({"init": {"exec": ["sleep", "600"]}})["id"])

        failures: list[BaseException] = []

        def load() -> None:
            try:
                for _ in range(10):
                    made.append(worker.create({"init": {"exec": ["sleep", "600"]}})["id"])
            except BaseException as exc:  # the test fails on it, below
                failures.append(exc)

        creating = threading.Thread(target=load)
        creating.start()
        dest = tmp_path / "backup.db"
        done = subprocess.run(
            [str(SOUK), "backup", "worker", "--data-dir", str(worker.data_dir), str(dest)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        creating.join()
        assert not failures and len(made) == 13
        assert done.returncode == 0, done.stderr
        assert dest.stat().st_mode & 0o077 == 0
        snapshot = sqlite3.connect(dest)
        backed_up = {r[0] for r in snapshot.execute("SELECT id FROM machines")}
        assert snapshot.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        snapshot.close()
        assert set(made[:3]) <= backed_up <= set(made)

        # Restore: the worker stopped, the copy in place of its database, started again.
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGTERM)
        worker.proc.wait(30)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{worker.db_path}{suffix}").unlink(missing_ok=True)
        shutil.copyfile(dest, worker.db_path)
        worker.start()
        listed = {m["id"]: m["state"] for m in worker.ok("GET", "/v1/machines")}
        assert set(listed) == backed_up
        assert all(state == "started" for state in listed.values()), listed
    finally:
        worker.seen.update(made)
        worker.close()

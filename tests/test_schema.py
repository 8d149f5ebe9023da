"""Schema versions and migrations of every database souk keeps, on real SQLite files: an earlier
release's files migrate (after a backup), a newer one is refused and left untouched, a failing
step leaves nothing half-done."""

from __future__ import annotations

import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from souk.broker.registry import REGISTRY_SCHEMA, AppRegistry
from souk.catalog.store import REPLICA_SCHEMA, ReplicaStore
from souk.schema import Schema, SchemaTooNew, migrate, version_of
from souk.worker.state.schema import WORKER_SCHEMA
from souk.worker.state.store import Store

FIXTURE = Path(__file__).parent / "fixtures" / "release-c03bc63"
SOUK = Path(sys.executable).parent / "souk"


def user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return version_of(conn)
    finally:
        conn.close()


def dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def set_user_version(path: Path, version: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()


def test_a_new_worker_database_has_the_current_version(tmp_path: Path) -> None:
    store = Store(tmp_path / "worker.db")
    store.close()
    assert user_version(tmp_path / "worker.db") == WORKER_SCHEMA.version
    assert not list(tmp_path.glob("*.bak"))  # nothing to back up in a new file


def test_an_earlier_releases_worker_database_migrates_after_a_backup(tmp_path: Path) -> None:
    db = tmp_path / "worker.db"
    shutil.copyfile(FIXTURE / "mad2.db", db)
    before = dump(db)
    assert user_version(db) == 0
    store = Store(db)
    rows = store.read.execute("SELECT id, state FROM machines ORDER BY id").fetchall()
    store.close()
    assert user_version(db) == WORKER_SCHEMA.version
    assert {r["state"] for r in rows} >= {"started", "suspended"}
    backup = tmp_path / "worker.db.v0.bak"
    assert dump(backup) == before and user_version(backup) == 0  # the file as it was
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600


def test_an_earlier_releases_registry_migrates_with_its_apps_and_secrets(tmp_path: Path) -> None:
    db = tmp_path / "apps.db"
    shutil.copyfile(FIXTURE / "apps.db", db)
    registry = AppRegistry(db)
    try:
        app = registry.get("fixture")
        assert app is not None
        assert registry.metadata("fixture")["team"] == "fixtures"
        assert "release.2" in registry.metadata("fixture")
        assert "API_KEY" in app.secrets
    finally:
        registry.close()
    assert user_version(db) == REGISTRY_SCHEMA.version
    assert (tmp_path / "apps.db.v0.bak").exists()


@pytest.mark.parametrize("part", ["worker", "registry"])
def test_a_database_from_a_newer_souk_is_refused_untouched(tmp_path: Path, part: str) -> None:
    db = tmp_path / ("worker.db" if part == "worker" else "apps.db")
    shutil.copyfile(FIXTURE / ("mad2.db" if part == "worker" else "apps.db"), db)
    set_user_version(db, 99)
    before = db.read_bytes()
    with pytest.raises(SchemaTooNew) as refused:
        if part == "worker":
            Store(db)
        else:
            AppRegistry(db)
    assert "99" in str(refused.value) and str(db) in str(refused.value)
    assert db.read_bytes() == before
    assert not list(tmp_path.glob("*.bak"))


def test_souk_worker_refuses_a_newer_database_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "w1"
    data.mkdir()
    shutil.copyfile(FIXTURE / "mad2.db", data / "worker.db")
    set_user_version(data / "worker.db", 99)
    argv = [str(SOUK), "worker", "--name", "w1", "--region", "mad", "--data-dir", str(data)]
    argv += ["--cpus", "1", "--memory-mb", "64", "--driver", "sim", "--listen", "127.0.0.1:0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "newer than this souk" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_failing_step_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(conn, Schema("test", ("CREATE TABLE a (x INTEGER);",)), db)
    conn.execute("INSERT INTO a VALUES (1)")
    broken = Schema(
        "test",
        (
            "CREATE TABLE a (x INTEGER);",
            "ALTER TABLE a ADD COLUMN y INTEGER; CREATE TABLE b (z INTEGER);",
            "INSERT INTO nowhere VALUES (1);",
        ),
    )
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, broken, db)
    assert version_of(conn) == 1
    assert [r[1] for r in conn.execute("PRAGMA table_info(a)")] == ["x"]
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'b'").fetchone() is None
    assert conn.execute("SELECT x FROM a").fetchall() == [(1,)]
    conn.close()


def test_a_replica_from_a_newer_souk_is_rebuilt_not_refused(tmp_path: Path) -> None:
    db = tmp_path / "catalog.db"
    store = ReplicaStore(db)
    store.conn.execute("INSERT INTO owners VALUES ('w1', 'mad', 'e', 7, NULL)")
    store.conn.close()
    set_user_version(db, REPLICA_SCHEMA.version + 1)
    again = ReplicaStore(db)
    try:
        assert again.conn.execute("SELECT count(*) FROM owners").fetchone()[0] == 0
        assert version_of(again.conn) == REPLICA_SCHEMA.version
    finally:
        again.conn.close()

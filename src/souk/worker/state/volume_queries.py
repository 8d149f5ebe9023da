"""Every SQL statement on volumes, their operations and their snapshots (tables in `schema.py`):
the volumes' part of `queries.py`, whose conventions it shares."""

from __future__ import annotations

from typing import Any

from souk.worker.errors import NotFound
from souk.worker.state.queries import Db, Row, one

# --- volumes ------------------------------------------------------------------------------------


def volume(db: Db, volume_id: str) -> Row | None:
    return one(db, "SELECT * FROM volumes WHERE id = ?", (volume_id,))


def existing_volume(db: Db, volume_id: str) -> Row:
    row = volume(db, volume_id)
    if row is None or row["state"] == "destroyed":
        raise NotFound(f"no volume {volume_id} on this worker")
    return row


def volumes(db: Db, app: str | None, include_destroyed: bool = False) -> list[Row]:
    sql, args = "SELECT * FROM volumes WHERE 1 = 1", []
    if app is not None:
        sql, args = sql + " AND app = ?", [app]
    if not include_destroyed:
        sql += " AND state != 'destroyed'"
    return db.execute(sql + " ORDER BY created_at, id", args).fetchall()


def live_volume_ids(db: Db) -> list[str]:
    """Volumes whose disk should exist and be mounted: made, and not on their way out."""
    rows = db.execute("SELECT id FROM volumes WHERE state IN ('created', 'extending')")
    return [row["id"] for row in rows]


def insert_volume(
    db: Db,
    volume_id: str,
    name: str,
    app: str,
    state: str,
    size_mb: int,
    retention: int,
    stamp: str,
) -> None:
    db.execute(
        "INSERT INTO volumes (id, name, app, state, projected, size_mb, reserved,"
        " snapshot_retention, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?)",
        (volume_id, name, app, state, "created", size_mb, retention, stamp, stamp),
    )


def set_volume_columns(db: Db, volume_id: str, columns: dict[str, Any]) -> None:
    names = ", ".join(f"{name} = ?" for name in columns)  # names are the callers' literals
    db.execute(f"UPDATE volumes SET {names} WHERE id = ?", (*columns.values(), volume_id))


def reserved_disk_mb(db: Db) -> int:
    row = one(db, "SELECT COALESCE(SUM(size_mb), 0) FROM volumes WHERE reserved = 1")
    return int(row[0]) if row is not None else 0


def volumes_attached_to(db: Db, machine_id: str) -> list[str]:
    rows = db.execute("SELECT id FROM volumes WHERE attached_machine = ?", (machine_id,))
    return [row["id"] for row in rows]


def detach_volumes(db: Db, machine_id: str) -> None:
    db.execute(
        "UPDATE volumes SET attached_machine = NULL WHERE attached_machine = ?", (machine_id,)
    )


def app_volume_names(db: Db, app: str) -> set[str]:
    rows = db.execute("SELECT name FROM volumes WHERE app = ? AND state != 'destroyed'", (app,))
    return {row["name"] for row in rows}


def snapshots(db: Db, volume_id: str) -> list[Row]:
    """Oldest first, as taken (two in one millisecond keep their order)."""
    sql = "SELECT * FROM volume_snapshots WHERE volume = ? ORDER BY rowid"
    return db.execute(sql, (volume_id,)).fetchall()


def snapshot(db: Db, snapshot_id: str) -> Row | None:
    return one(db, "SELECT * FROM volume_snapshots WHERE id = ?", (snapshot_id,))


def insert_snapshot(
    db: Db, snapshot_id: str, volume_id: str, size: int, volume_size: int, stamp: str
) -> None:
    db.execute(
        "INSERT OR IGNORE INTO volume_snapshots VALUES (?, ?, ?, ?, ?)",
        (snapshot_id, volume_id, size, volume_size, stamp),
    )


def delete_snapshot(db: Db, snapshot_id: str) -> None:
    db.execute("DELETE FROM volume_snapshots WHERE id = ?", (snapshot_id,))


def delete_snapshots(db: Db, volume_id: str) -> None:
    db.execute("DELETE FROM volume_snapshots WHERE volume = ?", (volume_id,))


def volumes_changed_since(db: Db, since: int, limit: int, live_only: bool) -> list[tuple[int, str]]:
    live = " AND state != 'destroyed'" if live_only else ""
    rows = db.execute(
        f"SELECT id, seq FROM volumes WHERE seq > ?{live} ORDER BY seq LIMIT ?", (since, limit)
    )
    return [(seq, volume_id) for volume_id, seq in rows]

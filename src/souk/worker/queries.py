"""Every SQL statement on the worker's tables (declared in `store.SCHEMA`), and nowhere else.

Each function runs on a `Db`: the store's read connection, or a write's `Tx` (then it is part of
that transaction). Rules about what the rows mean live with their callers; these only read and
write them, so a change of schema is a change of this module and `store.py` alone.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Protocol

from souk.models.api import Lease
from souk.models.machine import MachineConfig
from souk.worker.errors import NotFound

Row = sqlite3.Row
BATCH = 500  # ids per `IN (...)`: well under SQLite's limit on bound parameters


class Db(Protocol):
    def execute(self, sql: str, args: Any = ..., /) -> sqlite3.Cursor: ...


def _one(db: Db, sql: str, args: tuple[Any, ...] = ()) -> Row | None:
    row: Row | None = db.execute(sql, args).fetchone()
    return row


# --- meta ---------------------------------------------------------------------------------------


def init_meta(db: Db, epoch: str, name: str) -> None:
    """First start only: what an existing database already holds is kept."""
    db.execute("INSERT OR IGNORE INTO meta VALUES ('epoch', ?)", (epoch,))
    db.execute("INSERT OR IGNORE INTO meta VALUES ('name', ?)", (name,))
    db.execute("INSERT OR IGNORE INTO meta VALUES ('cordoned', '0')")


def cordoned(db: Db) -> bool:
    row = _one(db, "SELECT value FROM meta WHERE key = 'cordoned'")
    return row is not None and row["value"] == "1"


def set_cordoned(db: Db, cordoned: bool) -> None:
    db.execute("UPDATE meta SET value = ? WHERE key = 'cordoned'", (str(int(cordoned)),))


# --- app users ----------------------------------------------------------------------------------


def app_user(db: Db, app: str) -> tuple[int, int] | None:
    row = _one(db, "SELECT uid, gid FROM app_users WHERE app = ?", (app,))
    return None if row is None else (int(row["uid"]), int(row["gid"]))


def last_app_slot(db: Db) -> int | None:
    row = _one(db, "SELECT MAX(slot) AS slot FROM app_users")
    return None if row is None or row["slot"] is None else int(row["slot"])


def insert_app_user(db: Db, app: str, slot: int, uid: int, gid: int, stamp: str) -> None:
    db.execute(
        "INSERT INTO app_users (app, slot, uid, gid, created_at) VALUES (?, ?, ?, ?, ?)",
        (app, slot, uid, gid, stamp),
    )


# --- machines -----------------------------------------------------------------------------------


def machine(db: Db, machine_id: str) -> Row | None:
    return _one(db, "SELECT * FROM machines WHERE id = ?", (machine_id,))


def _found(row: Row | None, machine_id: str) -> Row:
    if row is None:
        raise NotFound(f"no machine {machine_id} on this worker")
    return row


def existing_machine(db: Db, machine_id: str) -> Row:
    return _found(machine(db, machine_id), machine_id)


def machine_exists(db: Db, machine_id: str) -> bool:
    return _one(db, "SELECT 1 FROM machines WHERE id = ?", (machine_id,)) is not None


def machines(db: Db, app: str | None, include_destroyed: bool) -> list[Row]:
    sql, args = "SELECT * FROM machines WHERE 1=1", []
    if app:
        sql, args = sql + " AND app = ?", [app]
    if not include_destroyed:
        sql += " AND state != 'destroyed'"
    return db.execute(sql + " ORDER BY created_at, id", args).fetchall()


def machine_states(db: Db) -> dict[str, int]:
    """Machines per state (destroyed ones left out): for metrics, read at scrape time."""
    rows = db.execute(
        "SELECT state, COUNT(*) FROM machines WHERE state != 'destroyed' GROUP BY state"
    )
    return {row[0]: int(row[1]) for row in rows}


def apps(db: Db) -> list[str]:
    rows = db.execute("SELECT DISTINCT app FROM machines WHERE state != 'destroyed' ORDER BY app")
    return [row[0] for row in rows]


def state_of(db: Db, machine_id: str) -> str:
    row = _one(db, "SELECT state FROM machines WHERE id = ?", (machine_id,))
    return str(_found(row, machine_id)["state"])


def driver_of(db: Db, machine_id: str) -> str | None:
    """The driver that started the machine's current process (its config may have moved on)."""
    row = _one(db, "SELECT driver FROM machines WHERE id = ?", (machine_id,))
    return None if row is None else row["driver"]


def process_of(db: Db, machine_id: str) -> tuple[int, str] | None:
    """The pid and pid start time of the machine's process, if it has one."""
    row = _found(
        _one(db, "SELECT pid, pid_start FROM machines WHERE id = ?", (machine_id,)), machine_id
    )
    return None if row["pid"] is None else (row["pid"], row["pid_start"])


def live_processes(db: Db) -> list[Row]:
    """Machines whose process may still run: what a restarted worker tries to adopt."""
    return db.execute(
        "SELECT id, pid, pid_start, marker, state, driver FROM machines"
        " WHERE state IN ('started', 'starting', 'stopping', 'suspended') AND pid IS NOT NULL"
    ).fetchall()


def started_ids(db: Db) -> list[str]:
    return [row["id"] for row in db.execute("SELECT id FROM machines WHERE state = 'started'")]


def started_with_checks(db: Db, machine_ids: list[str]) -> dict[str, Row]:
    """Of these machines, the started ones: what tells their process apart, and their checks."""
    found: dict[str, Row] = {}
    for i in range(0, len(machine_ids), BATCH):
        batch = machine_ids[i : i + BATCH]
        rows = db.execute(
            "SELECT id, instance_id, pid, private_ip, json_extract(config, '$.checks') checks,"
            " json_extract(config, '$.services') services"
            " FROM machines WHERE state = 'started'"
            f" AND id IN ({', '.join('?' * len(batch))})",
            batch,
        )
        found.update((row["id"], row) for row in rows)
    return found


def ip_in_use(db: Db, ip: str) -> bool:
    sql = "SELECT 1 FROM machines WHERE private_ip = ? AND state != 'destroyed'"
    return _one(db, sql, (ip,)) is not None


def ip_named(db: Db, ip: str) -> bool:
    """Whether any row names the address, a destroyed machine's too (a replica may still show
    it): a live one through the index, a destroyed one by a scan of those alone."""
    if ip_in_use(db, ip):
        return True
    sql = "SELECT 1 FROM machines WHERE state = 'destroyed' AND private_ip = ?"
    return _one(db, sql, (ip,)) is not None


def insert_machine(
    db: Db,
    machine_id: str,
    name: str,
    app: str,
    instance_id: str,
    config: MachineConfig,
    private_ip: str,
    stamp: str,
) -> None:
    """A new machine, `created`, its guest reserved."""
    guest = config.guest
    db.execute(
        "INSERT INTO machines (id, name, app, state, projected, instance_id, config,"
        " cpu_kind, cpus, memory_mb, reserved, private_ip, created_at, updated_at, seq)"
        " VALUES (?, ?, ?, 'created', 'created', ?, ?, ?, ?, ?, 1, ?, ?, ?, 0)",
        (
            machine_id,
            name,
            app,
            instance_id,
            config.model_dump_json(),
            guest.cpu_kind,
            guest.cpus,
            guest.memory_mb,
            private_ip,
            stamp,
            stamp,
        ),
    )


def set_private_ip(db: Db, machine_id: str, ip: str) -> None:
    db.execute("UPDATE machines SET private_ip = ? WHERE id = ?", (ip, machine_id))


def set_config(
    db: Db, machine_id: str, config: MachineConfig, stamp: str, instance_id: str | None = None
) -> None:
    """A new config; with a new instance id, its guest's size and cpu kind too."""
    if instance_id is None:
        db.execute(
            "UPDATE machines SET config = ?, updated_at = ? WHERE id = ?",
            (config.model_dump_json(), stamp, machine_id),
        )
        return
    guest = config.guest
    db.execute(
        "UPDATE machines SET cpus = ?, memory_mb = ?, cpu_kind = ?, config = ?,"
        " instance_id = ?, updated_at = ? WHERE id = ?",
        (
            guest.cpus,
            guest.memory_mb,
            guest.cpu_kind,
            config.model_dump_json(),
            instance_id,
            stamp,
            machine_id,
        ),
    )


def set_columns(db: Db, machine_id: str, columns: dict[str, Any]) -> None:
    """Set these columns of the machine's row (names from the code, never from a request)."""
    db.execute(
        f"UPDATE machines SET {', '.join(f'{k} = ?' for k in columns)} WHERE id = ?",
        (*columns.values(), machine_id),
    )


def set_projected(db: Db, machine_id: str, projected: str) -> None:
    db.execute("UPDATE machines SET projected = ? WHERE id = ?", (projected, machine_id))


def reset_projection(db: Db, machine_id: str) -> None:
    db.execute("UPDATE machines SET projected = state WHERE id = ?", (machine_id,))


def set_process(db: Db, machine_id: str, pid: int, pid_start: str) -> None:
    db.execute(
        "UPDATE machines SET pid = ?, pid_start = ? WHERE id = ?", (pid, pid_start, machine_id)
    )


def set_exit_code(db: Db, machine_id: str, code: int | None) -> None:
    db.execute("UPDATE machines SET exit_code = ? WHERE id = ?", (code, machine_id))


def set_exited(db: Db, machine_id: str, state: str, crash_streak: int, stamp: str) -> None:
    """The process is gone and nothing was queued to stop it: the state the policy settled on."""
    db.execute(
        "UPDATE machines SET state = ?, projected = ?, pid = NULL,"
        " crash_streak = ?, updated_at = ? WHERE id = ?",
        (state, state, crash_streak, stamp, machine_id),
    )


def count_restart(db: Db, machine_id: str) -> None:
    db.execute("UPDATE machines SET restart_count = restart_count + 1 WHERE id = ?", (machine_id,))


def set_failed(db: Db, machine_id: str, state: str, stamp: str) -> None:
    """An operation failed: the state it leaves the machine in, with no process of record."""
    db.execute(
        "UPDATE machines SET state = ?, pid = NULL, updated_at = ? WHERE id = ?",
        (state, stamp, machine_id),
    )


def set_destroyed(db: Db, machine_id: str, stamp: str) -> None:
    db.execute(
        "UPDATE machines SET state = 'destroyed', projected = 'destroyed',"
        " reserved = 0, updated_at = ? WHERE id = ?",
        (stamp, machine_id),
    )


def set_machine_secrets(db: Db, machine_id: str, sealed: str | None) -> None:
    """The machine's sealed secrets (`worker/secrets.py`); None: it has none."""
    if sealed is None:
        db.execute("DELETE FROM machine_secrets WHERE machine = ?", (machine_id,))
        return
    db.execute(
        "INSERT OR REPLACE INTO machine_secrets (machine, sealed) VALUES (?, ?)",
        (machine_id, sealed),
    )


def machine_secrets(db: Db, machine_id: str) -> str | None:
    row = _one(db, "SELECT sealed FROM machine_secrets WHERE machine = ?", (machine_id,))
    return None if row is None else str(row["sealed"])


# --- operations ---------------------------------------------------------------------------------


def insert_operation(db: Db, machine_id: str, op: str, params: dict[str, Any]) -> int:
    cur = db.execute(
        "INSERT INTO operations (machine, op, params, created_at) VALUES (?, ?, ?, ?)",
        (machine_id, op, json.dumps(params), time.time()),
    )
    return int(cur.lastrowid or 0)


def next_operation(db: Db, machine_id: str) -> Row | None:
    """The machine's oldest operation not yet done: the one its runner works on."""
    return _one(
        db,
        "SELECT * FROM operations WHERE machine = ? AND done = 0 ORDER BY id LIMIT 1",
        (machine_id,),
    )


def has_pending(db: Db, machine_id: str) -> bool:
    sql = "SELECT 1 FROM operations WHERE machine = ? AND done = 0"
    return _one(db, sql, (machine_id,)) is not None


def pending_count(db: Db) -> int:
    row = _one(db, "SELECT COUNT(*) FROM operations WHERE done = 0")
    return int(row[0]) if row is not None else 0


def queued_after(db: Db, machine_id: str, op_id: int) -> bool:
    sql = "SELECT 1 FROM operations WHERE machine = ? AND done = 0 AND id > ?"
    return _one(db, sql, (machine_id, op_id)) is not None


def pending_operation_ids(db: Db) -> set[int]:
    return {row[0] for row in db.execute("SELECT id FROM operations WHERE done = 0")}


def machines_with_pending(db: Db) -> list[str]:
    rows = db.execute("SELECT DISTINCT machine FROM operations WHERE done = 0")
    return [row["machine"] for row in rows]


def operation_progress(db: Db, op_id: int) -> int:
    """The index of the operation's first step not logged yet."""
    row = _one(db, "SELECT next_step FROM operations WHERE id = ?", (op_id,))
    return 0 if row is None else int(row["next_step"])


def set_progress(db: Db, op_id: int, next_step: int, done: bool) -> None:
    db.execute(
        "UPDATE operations SET next_step = ?, done = ? WHERE id = ?",
        (next_step, int(done), op_id),
    )


def finish_operation(db: Db, op_id: int) -> None:
    db.execute("UPDATE operations SET done = 1 WHERE id = ?", (op_id,))


def pending_operations(db: Db, machine_id: str) -> list[Row]:
    """The machine's operations not yet done, oldest first."""
    sql = "SELECT id, op, params FROM operations WHERE machine = ? AND done = 0 ORDER BY id"
    return db.execute(sql, (machine_id,)).fetchall()


def operation_done(db: Db, op_id: int) -> bool:
    row = _one(db, "SELECT done FROM operations WHERE id = ?", (op_id,))
    return row is None or bool(row["done"])


def finish_operations(db: Db, machine_id: str, next_step: int) -> None:
    """Every operation still queued for the machine, done (it is gone)."""
    db.execute(
        "UPDATE operations SET next_step = ?, done = 1 WHERE machine = ? AND done = 0",
        (next_step, machine_id),
    )


# --- provisional holds --------------------------------------------------------------------------


def insert_hold(db: Db, machine_id: str, until: float) -> None:
    db.execute("INSERT OR REPLACE INTO holds VALUES (?, ?)", (machine_id, until))


def hold_until(db: Db, machine_id: str) -> float | None:
    row = _one(db, "SELECT until FROM holds WHERE machine = ?", (machine_id,))
    return None if row is None else float(row["until"])


def delete_hold(db: Db, machine_id: str) -> bool:
    """Whether the machine was held."""
    return db.execute("DELETE FROM holds WHERE machine = ?", (machine_id,)).rowcount > 0


def next_hold(db: Db) -> float | None:
    row = _one(db, "SELECT MIN(until) FROM holds")
    return None if row is None or row[0] is None else float(row[0])


def due_holds(db: Db, now: float, limit: int = BATCH) -> list[str]:
    rows = db.execute("SELECT machine FROM holds WHERE until <= ? LIMIT ?", (now, limit))
    return [row[0] for row in rows]


# --- capacity -----------------------------------------------------------------------------------


def reserved(db: Db) -> tuple[int, int, int]:
    """Cpus, memory and machines reserved by machines not yet destroyed."""
    row = _one(db, "SELECT cpus, memory_mb, machines FROM capacity")
    return (row["cpus"], row["memory_mb"], row["machines"]) if row else (0, 0, 0)


def adjust_reserved(db: Db, cpus: int, memory_mb: int, machines: int) -> None:
    db.execute(
        "UPDATE capacity SET cpus = cpus + ?, memory_mb = memory_mb + ?, machines = machines + ?",
        (cpus, memory_mb, machines),
    )


# --- leases -------------------------------------------------------------------------------------


def lease(db: Db, machine_id: str) -> Lease | None:
    """The machine's lease, if one is held now (an expired one counts as none)."""
    row = _one(
        db, "SELECT * FROM leases WHERE machine = ? AND expires_at > ?", (machine_id, time.time())
    )
    if row is None:
        return None
    return Lease(
        nonce=row["nonce"],
        owner=row["owner"],
        description=row["description"],
        version=row["version"],
        expires_at=int(row["expires_at"]),
    )


def put_lease(db: Db, machine_id: str, lease: Lease) -> None:
    db.execute(
        "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?)",
        (machine_id, lease.nonce, lease.owner, lease.description, lease.version, lease.expires_at),
    )


def delete_lease(db: Db, machine_id: str) -> None:
    db.execute("DELETE FROM leases WHERE machine = ?", (machine_id,))


# --- images -------------------------------------------------------------------------------------


def image(db: Db, digest: str) -> Row | None:
    return _one(db, "SELECT ref, size FROM images WHERE digest = ?", (digest,))


def image_digests(db: Db) -> set[str]:
    return {row["digest"] for row in db.execute("SELECT digest FROM images")}


def insert_image(db: Db, digest: str, ref: str, size: int) -> None:
    db.execute("INSERT INTO images VALUES (?, ?, ?, 0)", (digest, ref, size))


def delete_image(db: Db, digest: str) -> None:
    db.execute("DELETE FROM images WHERE digest = ?", (digest,))


# --- the log, as events and as a change feed ----------------------------------------------------


def events(db: Db, resource: str, limit: int) -> list[Row]:
    """The resource's log entries, newest first."""
    return db.execute(
        "SELECT seq, ts, op, step, state, data FROM oplog WHERE resource = ?"
        " ORDER BY seq DESC LIMIT ?",
        (resource, limit),
    ).fetchall()


def machines_changed_since(db: Db, since: int, limit: int) -> list[tuple[int, str]]:
    """(seq, id) of machines last changed after `since`, oldest change first, at most `limit`."""
    rows = db.execute(
        "SELECT id, seq FROM machines WHERE seq > ? ORDER BY seq LIMIT ?", (since, limit)
    )
    return [(seq, machine_id) for machine_id, seq in rows]


def images_changed_since(db: Db, since: int) -> list[tuple[int, str]]:
    """(seq, digest) of every image logged after `since`, with its last entry's seq: an evicted
    image is found here although its row is gone."""
    rows = db.execute(
        "SELECT resource, MAX(seq) FROM oplog WHERE kind = 'image' AND seq > ? GROUP BY resource",
        (since,),
    )
    return [(seq, digest) for digest, seq in rows]


def scheduled_idle(db: Db) -> list[Row]:
    """Machines with a `schedule` that are not running and have nothing queued: those the
    scheduler may start, with when each last spawned a process (None: never)."""
    return db.execute(
        "SELECT m.id, m.created_at, json_extract(m.config, '$.schedule') schedule,"
        " (SELECT MAX(ts) FROM oplog o WHERE o.resource = m.id AND o.step = 'spawn') last_spawn"
        " FROM machines m WHERE json_extract(m.config, '$.schedule') IS NOT NULL"
        " AND m.state IN ('created', 'stopped', 'failed')"
        " AND NOT EXISTS (SELECT 1 FROM operations p WHERE p.machine = m.id AND p.done = 0)"
    ).fetchall()


# --- volumes ------------------------------------------------------------------------------------


def volume(db: Db, volume_id: str) -> Row | None:
    return _one(db, "SELECT * FROM volumes WHERE id = ?", (volume_id,))


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
    row = _one(db, "SELECT COALESCE(SUM(size_mb), 0) FROM volumes WHERE reserved = 1")
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


def insert_volume_operation(db: Db, volume_id: str, op: str, params: dict[str, Any]) -> int:
    cur = db.execute(
        "INSERT INTO volume_operations (volume, op, params, created_at) VALUES (?, ?, ?, ?)",
        (volume_id, op, json.dumps(params), time.time()),
    )
    return int(cur.lastrowid or 0)


def next_volume_operation(db: Db, volume_id: str) -> Row | None:
    return _one(
        db,
        "SELECT * FROM volume_operations WHERE volume = ? AND done = 0 ORDER BY id LIMIT 1",
        (volume_id,),
    )


def volume_has_pending(db: Db, volume_id: str) -> bool:
    sql = "SELECT 1 FROM volume_operations WHERE volume = ? AND done = 0"
    return _one(db, sql, (volume_id,)) is not None


def volumes_with_pending(db: Db) -> list[str]:
    rows = db.execute("SELECT DISTINCT volume FROM volume_operations WHERE done = 0")
    return [row["volume"] for row in rows]


def set_volume_progress(db: Db, op_id: int, next_step: int, done: bool) -> None:
    db.execute(
        "UPDATE volume_operations SET next_step = ?, done = ? WHERE id = ?",
        (next_step, int(done), op_id),
    )


def finish_volume_operations(db: Db, volume_id: str) -> None:
    db.execute("UPDATE volume_operations SET done = 1 WHERE volume = ? AND done = 0", (volume_id,))


def snapshots(db: Db, volume_id: str) -> list[Row]:
    """Oldest first, as taken (two in one millisecond keep their order)."""
    sql = "SELECT * FROM volume_snapshots WHERE volume = ? ORDER BY rowid"
    return db.execute(sql, (volume_id,)).fetchall()


def snapshot(db: Db, snapshot_id: str) -> Row | None:
    return _one(db, "SELECT * FROM volume_snapshots WHERE id = ?", (snapshot_id,))


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


def volume_operation_error(db: Db, volume_id: str, op_id: int) -> str | None:
    """Why the volume's operation failed, if it did (its `error` entry in the log)."""
    row = _one(
        db,
        "SELECT data FROM oplog WHERE resource = ? AND op_id = ? AND step = 'error'"
        " ORDER BY seq DESC LIMIT 1",
        (volume_id, op_id),
    )
    return None if row is None else str(json.loads(row["data"]).get("error", "failed"))


def volumes_changed_since(db: Db, since: int, limit: int, live_only: bool) -> list[tuple[int, str]]:
    live = " AND state != 'destroyed'" if live_only else ""
    rows = db.execute(
        f"SELECT id, seq FROM volumes WHERE seq > ?{live} ORDER BY seq LIMIT ?", (since, limit)
    )
    return [(seq, volume_id) for volume_id, seq in rows]


# --- config versions ---------------------------------------------------------------------------


def add_version(db: Db, machine_id: str, version: str, config: MachineConfig, stamp: str) -> None:
    db.execute(
        "INSERT OR REPLACE INTO machine_versions (machine, version, config, created_at)"
        " VALUES (?, ?, ?, ?)",
        (machine_id, version, config.model_dump_json(), stamp),
    )


def image_pin(db: Db, machine_id: str, version: str) -> str | None:
    """The digest of the image this version of the machine first started with, if it has."""
    row = db.execute(
        "SELECT digest FROM image_pins WHERE machine = ? AND version = ?", (machine_id, version)
    ).fetchone()
    return None if row is None else str(row["digest"])


def pin_image(db: Db, machine_id: str, version: str, digest: str) -> None:
    db.execute(
        "INSERT OR REPLACE INTO image_pins (machine, version, digest) VALUES (?, ?, ?)",
        (machine_id, version, digest),
    )


def unpin_images(db: Db, machine_id: str) -> None:
    """A destroyed machine starts no version again."""
    db.execute("DELETE FROM image_pins WHERE machine = ?", (machine_id,))


def versions(db: Db, machine_id: str) -> list[Row]:
    """Every config the machine was given, newest first (rowid: the order they came in)."""
    return db.execute(
        "SELECT version, config, created_at FROM machine_versions WHERE machine = ?"
        " ORDER BY rowid DESC",
        (machine_id,),
    ).fetchall()

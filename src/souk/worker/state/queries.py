"""Every SQL statement on the worker's tables (declared in `schema.py`), and nowhere else: here,
with a volume's in `volume_queries.py` and an operation queue's in `operations.py`.

Each function runs on a `Db`: the store's read connection, or a write's `Tx` (then it is part of
that transaction). Rules about what the rows mean live with their callers; these only read and
write them, so a change of schema is a change of these modules and `schema.py` alone.
"""

from __future__ import annotations

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


def one(db: Db, sql: str, args: tuple[Any, ...] = ()) -> Row | None:
    row: Row | None = db.execute(sql, args).fetchone()
    return row


# --- meta ---------------------------------------------------------------------------------------


def init_meta(db: Db, epoch: str, name: str) -> None:
    """First start only: what an existing database already holds is kept."""
    db.execute("INSERT OR IGNORE INTO meta VALUES ('epoch', ?)", (epoch,))
    db.execute("INSERT OR IGNORE INTO meta VALUES ('name', ?)", (name,))
    db.execute("INSERT OR IGNORE INTO meta VALUES ('cordoned', '0')")


def cordoned(db: Db) -> bool:
    row = one(db, "SELECT value FROM meta WHERE key = 'cordoned'")
    return row is not None and row["value"] == "1"


def set_cordoned(db: Db, cordoned: bool) -> None:
    db.execute("UPDATE meta SET value = ? WHERE key = 'cordoned'", (str(int(cordoned)),))


# --- app users ----------------------------------------------------------------------------------


def app_user(db: Db, app: str) -> tuple[int, int] | None:
    row = one(db, "SELECT uid, gid FROM app_users WHERE app = ?", (app,))
    return None if row is None else (int(row["uid"]), int(row["gid"]))


def last_app_slot(db: Db) -> int | None:
    row = one(db, "SELECT MAX(slot) AS slot FROM app_users")
    return None if row is None or row["slot"] is None else int(row["slot"])


def insert_app_user(db: Db, app: str, slot: int, uid: int, gid: int, stamp: str) -> None:
    db.execute(
        "INSERT INTO app_users (app, slot, uid, gid, created_at) VALUES (?, ?, ?, ?, ?)",
        (app, slot, uid, gid, stamp),
    )


# --- machines -----------------------------------------------------------------------------------


def machine(db: Db, machine_id: str) -> Row | None:
    return one(db, "SELECT * FROM machines WHERE id = ?", (machine_id,))


def _found(row: Row | None, machine_id: str) -> Row:
    if row is None:
        raise NotFound(f"no machine {machine_id} on this worker")
    return row


def existing_machine(db: Db, machine_id: str) -> Row:
    return _found(machine(db, machine_id), machine_id)


def machine_exists(db: Db, machine_id: str) -> bool:
    return one(db, "SELECT 1 FROM machines WHERE id = ?", (machine_id,)) is not None


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
    row = one(db, "SELECT state FROM machines WHERE id = ?", (machine_id,))
    return str(_found(row, machine_id)["state"])


def driver_of(db: Db, machine_id: str) -> str | None:
    """The driver that started the machine's current process (its config may have moved on)."""
    row = one(db, "SELECT driver FROM machines WHERE id = ?", (machine_id,))
    return None if row is None else row["driver"]


def process_of(db: Db, machine_id: str) -> tuple[int, str] | None:
    """The pid and pid start time of the machine's process, if it has one."""
    row = _found(
        one(db, "SELECT pid, pid_start FROM machines WHERE id = ?", (machine_id,)), machine_id
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
    return one(db, sql, (ip,)) is not None


def ip_named(db: Db, ip: str) -> bool:
    """Whether any row names the address, a destroyed machine's too (a replica may still show
    it): a live one through the index, a destroyed one by a scan of those alone."""
    if ip_in_use(db, ip):
        return True
    sql = "SELECT 1 FROM machines WHERE state = 'destroyed' AND private_ip = ?"
    return one(db, sql, (ip,)) is not None


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
    row = one(db, "SELECT sealed FROM machine_secrets WHERE machine = ?", (machine_id,))
    return None if row is None else str(row["sealed"])


# --- provisional holds --------------------------------------------------------------------------


def insert_hold(db: Db, machine_id: str, until: float) -> None:
    db.execute("INSERT OR REPLACE INTO holds VALUES (?, ?)", (machine_id, until))


def hold_until(db: Db, machine_id: str) -> float | None:
    row = one(db, "SELECT until FROM holds WHERE machine = ?", (machine_id,))
    return None if row is None else float(row["until"])


def delete_hold(db: Db, machine_id: str) -> bool:
    """Whether the machine was held."""
    return db.execute("DELETE FROM holds WHERE machine = ?", (machine_id,)).rowcount > 0


def next_hold(db: Db) -> float | None:
    row = one(db, "SELECT MIN(until) FROM holds")
    return None if row is None or row[0] is None else float(row[0])


def due_holds(db: Db, now: float, limit: int = BATCH) -> list[str]:
    rows = db.execute("SELECT machine FROM holds WHERE until <= ? LIMIT ?", (now, limit))
    return [row[0] for row in rows]


# --- capacity -----------------------------------------------------------------------------------


def reserved(db: Db) -> tuple[int, int, int]:
    """Cpus, memory and machines reserved by machines not yet destroyed."""
    row = one(db, "SELECT cpus, memory_mb, machines FROM capacity")
    return (row["cpus"], row["memory_mb"], row["machines"]) if row else (0, 0, 0)


def adjust_reserved(db: Db, cpus: int, memory_mb: int, machines: int) -> None:
    db.execute(
        "UPDATE capacity SET cpus = cpus + ?, memory_mb = memory_mb + ?, machines = machines + ?",
        (cpus, memory_mb, machines),
    )


# --- leases -------------------------------------------------------------------------------------


def lease(db: Db, machine_id: str) -> Lease | None:
    """The machine's lease, if one is held now (an expired one counts as none)."""
    row = one(
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
    return one(db, "SELECT ref, size FROM images WHERE digest = ?", (digest,))


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

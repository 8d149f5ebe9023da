"""worker.db's tables: version 1 as written, then every migration in order (souk.schema).

Every statement on them is in `queries.py`; `store.py` opens the database at the newest version.
"""

from __future__ import annotations

from souk.schema import Schema

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS app_users (
    app TEXT PRIMARY KEY,
    slot INTEGER NOT NULL UNIQUE,  -- the n-th app to run on this worker; never given again
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS oplog (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,          -- resource kind: machine, worker
    resource TEXT NOT NULL,      -- resource id
    op TEXT NOT NULL,            -- operation name, or 'event' for things that happened to it
    op_id INTEGER,               -- the operation this step belongs to
    step TEXT NOT NULL,
    state TEXT,                  -- the resource's state after this step
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS oplog_resource ON oplog (resource, seq);
CREATE TABLE IF NOT EXISTS machines (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    app TEXT NOT NULL,
    state TEXT NOT NULL,
    projected TEXT NOT NULL,     -- the state once every queued operation has run
    instance_id TEXT NOT NULL,
    config TEXT NOT NULL,
    cpu_kind TEXT NOT NULL,
    cpus INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    reserved INTEGER NOT NULL,   -- 1 while its resources count against the worker's capacity
    pid INTEGER,
    pid_start TEXT,              -- process start time, so a recycled pid is never taken for ours
    marker TEXT,                 -- the token in its environment that finds it after a crash
    driver TEXT,                 -- command or image: the driver that runs its current process
    private_ip TEXT,
    restart_count INTEGER NOT NULL DEFAULT 0,
    crash_streak INTEGER NOT NULL DEFAULT 0,
    exit_code INTEGER,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    seq INTEGER NOT NULL         -- oplog seq of the commit that last changed this row
);
CREATE INDEX IF NOT EXISTS machines_app ON machines (app);
CREATE INDEX IF NOT EXISTS machines_seq ON machines (seq);
CREATE INDEX IF NOT EXISTS machines_ip ON machines (private_ip) WHERE state != 'destroyed';
CREATE TABLE IF NOT EXISTS capacity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    cpus INTEGER NOT NULL,       -- reserved, by machines not yet destroyed
    memory_mb INTEGER NOT NULL,
    machines INTEGER NOT NULL
);
INSERT OR IGNORE INTO capacity VALUES (1, 0, 0, 0);
CREATE TABLE IF NOT EXISTS images (
    digest TEXT PRIMARY KEY,     -- what the image cache holds, as last logged
    ref TEXT NOT NULL,
    size INTEGER NOT NULL,
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    machine TEXT PRIMARY KEY,
    nonce TEXT NOT NULL,
    owner TEXT NOT NULL,
    description TEXT NOT NULL,
    version TEXT NOT NULL,       -- the machine's instance id when the lease was taken
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS operations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    machine TEXT NOT NULL,
    op TEXT NOT NULL,
    next_step INTEGER NOT NULL DEFAULT 0,
    done INTEGER NOT NULL DEFAULT 0,
    params TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS machine_secrets (
    machine TEXT PRIMARY KEY,    -- the app's secrets as the machine's last create or update
    sealed TEXT NOT NULL         -- brought them, sealed with the worker's key; never published
);

CREATE TABLE IF NOT EXISTS machine_versions (
    machine TEXT NOT NULL,
    version TEXT NOT NULL,       -- the instance id the config was given with
    config TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (machine, version)
);
CREATE TABLE IF NOT EXISTS image_pins (
    machine TEXT NOT NULL,
    version TEXT NOT NULL,       -- the instance id whose config names the image
    digest TEXT NOT NULL,        -- what the image's tag named at that version's first start
    PRIMARY KEY (machine, version)
);
CREATE INDEX IF NOT EXISTS operations_pending ON operations (machine, id) WHERE done = 0;
CREATE TABLE IF NOT EXISTS volumes (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    app TEXT NOT NULL,
    state TEXT NOT NULL,
    projected TEXT NOT NULL,     -- the state once every queued operation has run
    size_mb INTEGER NOT NULL,    -- the size it has, or is growing to: what it reserves
    reserved INTEGER NOT NULL,   -- 1 while its size counts against --disk-mb
    snapshot_retention INTEGER NOT NULL,
    attached_machine TEXT,       -- the machine (not destroyed) that mounts it
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS volumes_app ON volumes (app);
CREATE INDEX IF NOT EXISTS volumes_seq ON volumes (seq);
CREATE TABLE IF NOT EXISTS volume_operations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    volume TEXT NOT NULL,
    op TEXT NOT NULL,
    next_step INTEGER NOT NULL DEFAULT 0,
    done INTEGER NOT NULL DEFAULT 0,
    params TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS volume_operations_pending ON volume_operations (volume, id)
    WHERE done = 0;
CREATE TABLE IF NOT EXISTS volume_snapshots (
    id TEXT PRIMARY KEY,
    volume TEXT NOT NULL,
    size INTEGER NOT NULL,       -- bytes on disk
    volume_size INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS volume_snapshots_volume ON volume_snapshots (volume, created_at);
CREATE TABLE IF NOT EXISTS holds (
    machine TEXT PRIMARY KEY,    -- a provisional machine: its creator has not confirmed it yet
    until REAL NOT NULL          -- wall-clock deadline: unconfirmed then, the worker destroys it
);
CREATE INDEX IF NOT EXISTS holds_until ON holds (until);
"""

# Every migration of worker.db, in order (souk.schema). SCHEMA above is version 1 and is not
# edited again: a change of schema is a step appended here, with a fixture under
# tests/fixtures/ written by the release before it.
WORKER_SCHEMA = Schema("worker", (SCHEMA,))

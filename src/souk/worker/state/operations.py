"""Every SQL statement on a queue of operations and the rows it moves, for each kind of resource.

Machines and volumes keep their operations in tables of the same shape (`operations`,
`volume_operations` in `schema.py`: an id, the resource, the operation, its next step, done,
its parameters), and their rows carry the same `state` and `projected` columns, so one set of
statements serves both, parameterised by the tables' names (names from the code, never from a
request). The operation engine (`worker/ops/`) reads and writes its log through these alone.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from souk.worker.errors import NotFound
from souk.worker.state.queries import Db, Row, one


@dataclass(frozen=True)
class OperationQueue:
    """The tables of one kind of resource: `table` holds its operations, each naming its
    resource in `column`; `rows` holds the resources, called `noun` in an error."""

    table: str
    column: str
    rows: str
    noun: str

    # --- the resource's row -----------------------------------------------------------------

    def existing(self, db: Db, resource: str) -> Row:
        row = one(db, f"SELECT * FROM {self.rows} WHERE id = ?", (resource,))
        if row is None:
            raise NotFound(f"no {self.noun} {resource} on this worker")
        return row

    def set_columns(self, db: Db, resource: str, columns: dict[str, Any]) -> None:
        """Set these columns of the resource's row (names from the code, never a request's)."""
        names = ", ".join(f"{name} = ?" for name in columns)
        db.execute(f"UPDATE {self.rows} SET {names} WHERE id = ?", (*columns.values(), resource))

    def reset_projection(self, db: Db, resource: str) -> None:
        db.execute(f"UPDATE {self.rows} SET projected = state WHERE id = ?", (resource,))

    # --- its operations ---------------------------------------------------------------------

    def insert(self, db: Db, resource: str, op: str, params: dict[str, Any]) -> int:
        cur = db.execute(
            f"INSERT INTO {self.table} ({self.column}, op, params, created_at) VALUES (?, ?, ?, ?)",
            (resource, op, json.dumps(params), time.time()),
        )
        return int(cur.lastrowid or 0)

    def next(self, db: Db, resource: str) -> Row | None:
        """The resource's oldest operation not yet done: the one its runner works on."""
        sql = f"SELECT * FROM {self.table} WHERE {self.column} = ? AND done = 0 ORDER BY id LIMIT 1"
        return one(db, sql, (resource,))

    def has_pending(self, db: Db, resource: str) -> bool:
        sql = f"SELECT 1 FROM {self.table} WHERE {self.column} = ? AND done = 0"
        return one(db, sql, (resource,)) is not None

    def queued_after(self, db: Db, resource: str, op_id: int) -> bool:
        sql = f"SELECT 1 FROM {self.table} WHERE {self.column} = ? AND done = 0 AND id > ?"
        return one(db, sql, (resource, op_id)) is not None

    def pending(self, db: Db, resource: str) -> list[Row]:
        """The resource's operations not yet done, oldest first."""
        sql = (
            f"SELECT id, op, params FROM {self.table} WHERE {self.column} = ? AND done = 0"
            " ORDER BY id"
        )
        return db.execute(sql, (resource,)).fetchall()

    def pending_count(self, db: Db) -> int:
        row = one(db, f"SELECT COUNT(*) FROM {self.table} WHERE done = 0")
        return int(row[0]) if row is not None else 0

    def pending_ids(self, db: Db) -> set[int]:
        return {row[0] for row in db.execute(f"SELECT id FROM {self.table} WHERE done = 0")}

    def with_pending(self, db: Db) -> list[str]:
        """Every resource with an operation not yet done."""
        rows = db.execute(f"SELECT DISTINCT {self.column} FROM {self.table} WHERE done = 0")
        return [row[0] for row in rows]

    def progress(self, db: Db, op_id: int) -> int:
        """The index of the operation's first step not logged yet."""
        row = one(db, f"SELECT next_step FROM {self.table} WHERE id = ?", (op_id,))
        return 0 if row is None else int(row["next_step"])

    def set_progress(self, db: Db, op_id: int, next_step: int, done: bool) -> None:
        db.execute(
            f"UPDATE {self.table} SET next_step = ?, done = ? WHERE id = ?",
            (next_step, int(done), op_id),
        )

    def done(self, db: Db, op_id: int) -> bool:
        row = one(db, f"SELECT done FROM {self.table} WHERE id = ?", (op_id,))
        return row is None or bool(row["done"])

    def finish(self, db: Db, op_id: int) -> None:
        db.execute(f"UPDATE {self.table} SET done = 1 WHERE id = ?", (op_id,))

    def finish_all(self, db: Db, resource: str, next_step: int) -> None:
        """Every operation still queued for the resource, done (it is gone)."""
        db.execute(
            f"UPDATE {self.table} SET next_step = ?, done = 1 WHERE {self.column} = ? AND done = 0",
            (next_step, resource),
        )


MACHINE_QUEUE = OperationQueue("operations", "machine", "machines", "machine")
VOLUME_QUEUE = OperationQueue("volume_operations", "volume", "volumes", "volume")


def operation_error(db: Db, resource: str, op_id: int) -> str | None:
    """Why the resource's operation failed, if it did (its `error` entry in the log)."""
    row = one(
        db,
        "SELECT data FROM oplog WHERE resource = ? AND op_id = ? AND step = 'error'"
        " ORDER BY seq DESC LIMIT 1",
        (resource, op_id),
    )
    return None if row is None else str(json.loads(row["data"]).get("error", "failed"))

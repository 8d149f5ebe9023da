"""Schema versions for every SQLite database souk keeps, and their migrations.

A database records the version of its schema in SQLite's `user_version`. A part that opens it
brings it up to the version its code knows, every missing step in one transaction, after a copy
of the file as it was (`NAME.vN.bak`, 0600): a migration that goes wrong, or a binary rolled
back, still has the old file to return to. A database from a newer souk is refused in one line
(`SchemaTooNew`): reading a schema one does not know is how rows get silently misread.

Version 1 is the schema as it stood before versions were recorded; its step is written to run
both on an empty file and on such an unversioned one (every statement `IF NOT EXISTS`, columns
added only where missing), so the databases of every earlier release open as version 0 and are
migrated like any other.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# One migration step: a script of SQL statements, or a function given the connection (inside
# the migration's transaction) for what SQL alone cannot say, such as "add a column if missing".
Step = str | Callable[[sqlite3.Connection], None]


class SchemaTooNew(Exception):
    """The database was written by a newer souk than this one."""

    def __init__(self, name: str, path: Path | None, found: int, known: int) -> None:
        where = f" {path}" if path else ""
        super().__init__(
            f"the {name} database{where} has schema version {found}, newer than this souk "
            f"knows ({known}): run the souk that wrote it, or restore the backup taken before "
            "the upgrade"
        )
        self.found = found
        self.known = known


@dataclass(frozen=True)
class Schema:
    """A database's migrations, in order: step N brings version N to version N + 1."""

    name: str
    steps: tuple[Step, ...]

    @property
    def version(self) -> int:
        return len(self.steps)


def version_of(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, schema: Schema, path: Path | None) -> int:
    """Brings the database on `conn` (opened in autocommit mode) to `schema.version`; returns
    the version it found. `path` is where the file lives, for the backup (None: in memory)."""
    found = version_of(conn)
    if found > schema.version:
        raise SchemaTooNew(schema.name, path, found, schema.version)
    if found == schema.version:
        return found
    if path is not None and has_tables(conn):
        backup(conn, path.with_name(f"{path.name}.v{found}.bak"))
    conn.execute("BEGIN IMMEDIATE")
    try:
        for step in schema.steps[found:]:
            run(conn, step)
        conn.execute(f"PRAGMA user_version = {schema.version}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return found


def run(conn: sqlite3.Connection, step: Step) -> None:
    if callable(step):
        step(conn)
    else:
        for statement in statements(step):
            conn.execute(statement)


def together(*steps: Step) -> Step:
    """Several steps as one version's step."""

    def step(conn: sqlite3.Connection) -> None:
        for part in steps:
            run(conn, part)

    return step


def backup(conn: sqlite3.Connection, dest: Path) -> None:
    """A consistent copy of the database on `conn` at `dest`, mode 0600 from its first byte.
    SQLite's online backup copies every page in one step, so a writer in another process (a
    running worker) neither waits for it nor leaves it half of one commit."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    os.chmod(tmp, 0o600)  # the umask may have taken bits; it cannot add them
    target = sqlite3.connect(tmp)
    try:
        conn.backup(target)
        target.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
    finally:
        target.close()
    os.replace(tmp, dest)


def statements(script: str) -> list[str]:
    """The statements of an SQL script, each whole: cut at each `;` that SQLite's own
    completeness test says ends one (not one inside a string or a comment)."""
    out: list[str] = []
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                out.append(pending.strip())
            pending = ""
    return out


def add_missing_columns(table: str, columns: dict[str, str]) -> Step:
    """A step that adds each of `columns` (name: its SQL definition) that `table` lacks."""

    def step(conn: sqlite3.Connection) -> None:
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        for name, definition in columns.items():
            if name not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")

    return step


def has_tables(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()
    return bool(row[0])

"""A replica's local SQLite copy: rows, per-owner heads, quarantined rows and the replica's own
sequence of applied changes (which subscriptions resume from); on a signed catalog, also the
owners' proofs of each row and head, and the certificates they were signed with, to relay them.

It is a cache of what the owners hold, rebuilt from them if lost, so it commits without fsync.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from souk.schema import Schema, add_missing_columns, migrate, together, version_of

log = logging.getLogger("souk.catalog.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS rows (
    owner TEXT NOT NULL,
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    row TEXT,                     -- NULL: deleted (kept so that a stale copy cannot revive it)
    proof TEXT,                   -- the owner's proof of this version (signing.Signed.row_proof)
    PRIMARY KEY (owner, tbl, key)
);
CREATE TABLE IF NOT EXISTS owners (
    owner TEXT PRIMARY KEY,
    region TEXT NOT NULL,
    epoch TEXT NOT NULL,
    head INTEGER NOT NULL,
    proof TEXT                    -- the owner's signed header that reached `head`
);
CREATE TABLE IF NOT EXISTS certs (
    fp TEXT PRIMARY KEY,
    der BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (
    owner TEXT NOT NULL,
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    row TEXT,
    error TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (owner, tbl, key, seq)
);
CREATE TABLE IF NOT EXISTS changes (
    lseq INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    row TEXT
);
"""
KEEP_CHANGES = 50_000

# The replica's migrations (souk.schema), applied without a backup: it is a cache of its owners'
# rows. A file from a newer souk is not refused but dropped and filled again from the bus.
REPLICA_SCHEMA = Schema(
    "catalog replica",
    (
        together(
            SCHEMA,
            add_missing_columns("rows", {"proof": "TEXT"}),  # a file made before proofs were kept
            add_missing_columns("owners", {"proof": "TEXT"}),
        ),
    ),
)


class ReplicaStore:
    def __init__(self, path: Path | str = ":memory:") -> None:
        self.conn = self._open(path)
        self.commits = 0  # transactions committed: batches applied together share one

    @staticmethod
    def _open(path: Path | str) -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        found = version_of(conn)
        if found > REPLICA_SCHEMA.version:
            conn.close()
            log.warning(
                "catalog replica %s has schema version %d, newer than this souk's %d: rebuilding"
                " it from the bus",
                path,
                found,
                REPLICA_SCHEMA.version,
            )
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        migrate(conn, REPLICA_SCHEMA, None)
        return conn

    def begin(self) -> None:
        """Opens a transaction, or joins the one already open."""
        if not self.conn.in_transaction:
            self.conn.execute("BEGIN")

    def commit(self) -> None:
        if not self.conn.in_transaction:
            return
        self.conn.execute("COMMIT")
        self.commits += 1
        if self.commits % 1000 == 0:
            self.conn.execute(
                "DELETE FROM changes WHERE lseq <= (SELECT MAX(lseq) FROM changes) - ?",
                (KEEP_CHANGES,),
            )

    def put(
        self,
        owner: str,
        table: str,
        key: str,
        seq: int,
        row: dict[str, Any] | None,
        text: bytes | None = None,
        proof: str | None = None,
    ) -> int:
        """Stores a row version (`text`: the row already encoded, if it is) and records it as a
        change; returns its local sequence."""
        stored = None if row is None else (text or orjson.dumps(row)).decode()
        # An upsert, not INSERT OR REPLACE, which deleted the row and inserted it again (a new
        # rowid, its page rebalanced) where an update rewrites it in place: a batch cost a
        # replica a fifth less, plain or signed (`bench/catalog_propagation.py --replay`).
        self.conn.execute(
            "INSERT INTO rows VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, tbl, key) DO UPDATE"
            " SET seq = excluded.seq, row = excluded.row, proof = excluded.proof",
            (owner, table, key, seq, stored, proof),
        )
        cur = self.conn.execute(
            "INSERT INTO changes (owner, tbl, key, seq, row) VALUES (?, ?, ?, ?, ?)",
            (owner, table, key, seq, stored),
        )
        return int(cur.lastrowid or 0)

    def drop_owner(self, owner: str) -> None:
        self.conn.execute("DELETE FROM rows WHERE owner = ?", (owner,))

    def save_owner(
        self, owner: str, region: str, epoch: str, head: int, proof: str | None = None
    ) -> None:
        self.conn.execute(
            "INSERT INTO owners VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner) DO UPDATE"
            " SET region = excluded.region, epoch = excluded.epoch, head = excluded.head,"
            " proof = excluded.proof",
            (owner, region, epoch, head, proof),
        )

    def save_cert(self, fp: str, der: bytes) -> None:
        self.conn.execute("INSERT OR IGNORE INTO certs VALUES (?, ?)", (fp, der))

    def certs(self) -> dict[str, bytes]:
        return {fp: bytes(der) for fp, der in self.conn.execute("SELECT fp, der FROM certs")}

    def live_rows(self, owners: set[str]) -> list[tuple[str, str, str, int, str, str | None]]:
        """What a snapshot relays: (owner, table, key, seq, row text, proof text), no tombstones."""
        cur = self.conn.execute(
            "SELECT owner, tbl, key, seq, row, proof FROM rows WHERE row IS NOT NULL"
        )
        return [r for r in cur if r[0] in owners]

    def head_proofs(self) -> dict[str, str | None]:
        return dict(self.conn.execute("SELECT owner, proof FROM owners"))

    def quarantine(self, owner: str, table: str, key: str, seq: int, row: Any, error: str) -> bool:
        cur = self.conn.execute(
            "INSERT OR IGNORE INTO quarantine VALUES (?, ?, ?, ?, ?, ?, ?)",
            (owner, table, key, seq, orjson.dumps(row).decode(), error, time.time()),
        )
        return cur.rowcount > 0

    def quarantine_count(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()[0])

    def quarantined(self) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            "SELECT owner, tbl, key, seq, error, at FROM quarantine ORDER BY at DESC LIMIT 1000"
        )
        names = ("owner", "table", "key", "seq", "error", "at")
        return [dict(zip(names, r, strict=True)) for r in cur]

    def all_rows(self) -> Iterator[tuple[str, str, str, int, dict[str, Any] | None]]:
        for owner, table, key, seq, text in self.conn.execute(
            "SELECT owner, tbl, key, seq, row FROM rows"
        ):
            yield owner, table, key, seq, None if text is None else orjson.loads(text)

    def owners(self) -> Iterator[tuple[str, str, str, int]]:
        yield from self.conn.execute("SELECT owner, region, epoch, head FROM owners")

    def changes_after(
        self, lseq: int, limit: int = 1000
    ) -> list[tuple[int, str, str, str, int, dict[str, Any] | None]]:
        cur = self.conn.execute(
            "SELECT lseq, owner, tbl, key, seq, row FROM changes WHERE lseq > ?"
            " ORDER BY lseq LIMIT ?",
            (lseq, limit),
        )
        return [
            (lseq_, owner, tbl, key, seq, None if row is None else orjson.loads(row))
            for lseq_, owner, tbl, key, seq, row in cur
        ]

    def oldest_change(self) -> int:
        row = self.conn.execute("SELECT MIN(lseq) FROM changes").fetchone()
        return int(row[0] or 0)

    def last_change(self) -> int:
        row = self.conn.execute("SELECT MAX(lseq) FROM changes").fetchone()
        return int(row[0] or 0)

    def close(self) -> None:
        self.conn.close()

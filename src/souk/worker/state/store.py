"""The worker's durable state: one SQLite database (WAL) holding the append-only operations log and
the state it implies, written by one thread with group commit.

Every write is a function run inside a transaction on the writer thread. Writes that arrive while a
commit is in flight are batched into the next transaction, each under its own savepoint, so one
fsync serves many requests and a failing write (a reservation that does not fit) rolls back alone.
A commit the file system refuses (full, read-only) fails every write of its batch with a
`StorageFault` and leaves the writer ready for the next batch: see `storage.py`.

A write may also be *deferred* (`durable=False`): committed without an fsync of its own, which the
next durable commit (or `synced()`, or at the latest `SYNC_WITHIN` seconds) gives it, as the log
is one file written in order. A process killed after a deferred commit loses nothing of it (its
pages are the kernel's); only a crash of the host can, and that ends every process the write led
to as well. Until it is durable, a deferred commit is announced to no listener, and `head()`
does not count it: nothing outside the worker learns of what it may lose. A store without fsync
(`durable=False`, `souk worker --no-fsync`) defers and announces the same way, fsync apart, so
its listeners (the catalog's feed) see the same commits grouped the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from souk.schema import migrate
from souk.secret_files import private_database
from souk.worker.state.schema import WORKER_SCHEMA
from souk.worker.state.storage import StorageWatch

T = TypeVar("T")
log = logging.getLogger("souk.worker.store")

SYNC_WITHIN = 0.5  # seconds at most before a deferred commit is made durable by itself


def now_iso() -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        + f".{int(time.time() * 1000) % 1000:03d}Z"
    )


@dataclass
class Tx:
    """The transaction a write function runs in: SQL plus the log it must append to."""

    conn: sqlite3.Connection
    touched: set[tuple[str, str]] = field(default_factory=set)
    first_seq: int = 0
    last_seq: int = 0

    def execute(self, sql: str, args: tuple[Any, ...] | dict[str, Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, args)

    def one(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.conn.execute(sql, args).fetchone()
        return row

    def log(
        self,
        kind: str,
        resource: str,
        op: str,
        step: str,
        state: str | None = None,
        op_id: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> int:
        cur = self.conn.execute(
            "INSERT INTO oplog (ts, kind, resource, op, op_id, step, state, data)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (time.time(), kind, resource, op, op_id, step, state, json.dumps(data or {})),
        )
        seq = int(cur.lastrowid or 0)
        self.first_seq = self.first_seq or seq
        self.last_seq = seq
        self.touched.add((kind, resource))
        if kind == "machine":
            self.conn.execute("UPDATE machines SET seq = ? WHERE id = ?", (seq, resource))
        elif kind == "image":
            self.conn.execute("UPDATE images SET seq = ? WHERE digest = ?", (seq, resource))
        elif kind == "volume":
            self.conn.execute("UPDATE volumes SET seq = ? WHERE id = ?", (seq, resource))
        return seq


@dataclass(frozen=True)
class Commit:
    """What one durable commit changed: its oplog range and the resources it touched."""

    first_seq: int
    last_seq: int
    touched: frozenset[tuple[str, str]]

    def then(self, later: Commit) -> Commit:
        """This commit and a later one, as one."""
        return Commit(
            self.first_seq or later.first_seq,
            later.last_seq or self.last_seq,
            self.touched | later.touched,
        )


# One queued request to the writer: a write (`fn`, durable or deferred), or, with `fn` None, a
# request that every commit so far be durable (`synced`).
_Entry = tuple[Callable[[Tx], Any] | None, Future[Any], bool]


class Store:
    def __init__(self, path: Path, durable: bool = True) -> None:
        self.path = path
        self.durable = durable
        self._queue: list[_Entry] = []
        self._cond = threading.Condition()
        self._closed = False
        self.listeners: list[Callable[[Commit], None]] = []
        # Told (writes in the group, seconds from BEGIN to COMMIT) by the writer thread.
        self.on_batch: Callable[[int, float], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.watch = StorageWatch(path.parent)
        private_database(path)  # every machine's config, secrets (sealed) and history
        conn = self._connect()
        migrate(conn, WORKER_SCHEMA, path)
        self._write_conn = conn
        self._mode = "FULL" if durable else "NORMAL"  # the writer's PRAGMA synchronous
        self.read = self._connect()
        # Deferred commits not durable yet: since when, and what they changed (announced once
        # they are). The head as durable commits leave it.
        self._unsynced_since: float | None = None
        self._unannounced: Commit | None = None
        self._durable_head = self._max_seq()
        self.commits = 0  # transactions committed by this store
        self._durable_commits = 0  # of which durable: the first this many
        self._thread = threading.Thread(target=self._writer, name="souk-store-writer", daemon=True)
        self._thread.start()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if self.durable else 'NORMAL'}")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    async def write(self, fn: Callable[[Tx], T], durable: bool = True) -> T:
        """Run `fn` in a transaction; returns once it is durably committed, or with
        `durable=False` once it is committed (deferred: see the module's docstring). A commit
        the file system refuses raises `StorageFault` (nothing of `fn` was kept)."""
        return await self._submit(fn, durable)

    async def synced(self, upto: int | None = None) -> None:
        """Returns once the first `upto` commits (every commit so far: None) are durable: at
        once unless one of them was deferred and no durable commit has come since."""
        if self._durable_commits < (self.commits if upto is None else upto):
            await self._submit(None, True)

    @property
    def unsynced(self) -> bool:
        """Whether a deferred commit is not durable yet."""
        return self._unsynced_since is not None

    async def _submit(self, fn: Callable[[Tx], T] | None, durable: bool) -> T:
        self._loop = asyncio.get_running_loop()
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("store is closed")
            self._queue.append((fn, future, durable))
            self._cond.notify()
        try:
            value = await asyncio.wrap_future(future)
        except (sqlite3.Error, OSError) as exc:
            fault = self.watch.fault_from(exc)
            if fault is None:
                raise
            raise fault from exc
        self.watch.cleared()
        return value

    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    if self._unsynced_since is None:
                        self._cond.wait()
                        continue
                    left = self._unsynced_since + SYNC_WITHIN - time.monotonic()
                    if left <= 0:
                        break  # a deferred commit waited long enough: made durable now
                    self._cond.wait(left)
                batch, self._queue = self._queue, []
                closing = self._closed
            if batch or self._unsynced_since is not None:
                self._run(batch)
            if closing:
                if self._unsynced_since is not None:
                    self._run([])  # what was deferred is made durable (tried once) on the way out
                with self._cond:
                    if not self._queue:
                        return

    def _run(self, batch: list[_Entry]) -> None:
        """One batch: its writes in one transaction, durable unless all of them were deferred;
        an empty batch (or one of `synced` requests only) makes the deferred commits durable."""
        writes = [(fn, future) for fn, future, _ in batch if fn is not None]
        syncs = [future for fn, future, _ in batch if fn is None]
        durable = not batch or any(d for _, _, d in batch)
        if not durable and self._unsynced_since is None:  # before its commit: see `head`
            self._unsynced_since = time.monotonic()
        committed, results = self._commit(writes, durable) if writes else (None, [])
        if committed is not None:
            self.commits += 1
            if durable and self._unsynced_since is None:
                self._durable_commits = self.commits
        sync_error: OSError | None = None
        if durable and self._unsynced_since is not None:
            try:
                if self.durable and (committed is None or not committed.last_seq):
                    self._fsync_log()  # no frame of its own to carry it: an fsync
            except OSError as exc:  # not durable yet: tried again by the next durable batch,
                sync_error = exc  # or by itself SYNC_WITHIN from now
                self._unsynced_since = time.monotonic()
            else:
                self._durable_commits = self.commits
                earlier, self._unannounced = self._unannounced, None
                self._unsynced_since = None
                if earlier is not None:
                    committed = earlier if committed is None else earlier.then(committed)
        elif committed is not None and not durable:
            earlier = self._unannounced
            self._unannounced = committed if earlier is None else earlier.then(committed)
            committed = None
        if committed is not None and committed.last_seq:
            self._durable_head = max(self._durable_head, committed.last_seq)
            self._announce(committed)
        for future in syncs:
            if not future.cancelled():
                if sync_error is not None:
                    future.set_exception(sync_error)
                else:
                    future.set_result(None)
        for future, value, error in results:
            if future.cancelled():  # its caller went away; the write stands all the same
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

    def _commit(
        self, writes: list[tuple[Callable[[Tx], Any], Future[Any]]], durable: bool
    ) -> tuple[Commit | None, list[tuple[Future[Any], Any, BaseException | None]]]:
        """One transaction for the batch's writes: what it changed (None if the commit failed)
        and each write's result or error."""
        conn = self._write_conn
        mode = "FULL" if durable and self.durable else "NORMAL"
        tx = Tx(conn)
        results: list[tuple[Future[Any], Any, BaseException | None]] = []
        began = time.perf_counter()
        try:
            if mode != self._mode:
                conn.execute(f"PRAGMA synchronous={mode}")
                self._mode = mode
            conn.execute("BEGIN IMMEDIATE")
            for fn, future in writes:
                conn.execute("SAVEPOINT w")
                saved = (tx.first_seq, tx.last_seq, set(tx.touched))
                try:
                    value = fn(tx)
                except BaseException as exc:  # a failed write rolls back alone
                    if not conn.in_transaction:  # SQLite gave up the whole transaction
                        raise
                    conn.execute("ROLLBACK TO w")
                    conn.execute("RELEASE w")
                    tx.first_seq, tx.last_seq, tx.touched = saved
                    results.append((future, None, exc))
                    continue
                conn.execute("RELEASE w")
                results.append((future, value, None))
            conn.execute("COMMIT")
        except BaseException as exc:  # the commit itself failed: the whole batch did
            self._rollback(conn)
            return None, [(future, None, exc) for _, future in writes]
        if self.on_batch is not None:
            self.on_batch(len(writes), time.perf_counter() - began)
        return Commit(tx.first_seq, tx.last_seq, frozenset(tx.touched)), results

    def _fsync_log(self) -> None:
        """Make the deferred commits durable when no commit of this batch did: an fsync of the
        write-ahead log, which holds them (or of the database, once checkpointed into it)."""
        for path in (Path(f"{self.path}-wal"), self.path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _announce(self, commit: Commit) -> None:
        if self.listeners and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._notify, commit)
            except RuntimeError:  # the loop is gone (shutting down): nobody to tell
                pass

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        """After a failed batch; on a full or read-only disk SQLite may refuse even this, and the
        writer must live on to serve the next batch."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.warning("rollback failed: %s", exc)

    def _notify(self, commit: Commit) -> None:
        for listener in self.listeners:
            listener(commit)

    def head(self) -> int:
        """The last seq of the log, as far as it is durable (a deferred commit's are not)."""
        if self._unsynced_since is not None:
            return self._durable_head
        return self._max_seq()

    def _max_seq(self) -> int:
        row = self.read.execute("SELECT COALESCE(MAX(seq), 0) FROM oplog").fetchone()
        return int(row[0])

    def meta(self, key: str) -> str | None:
        row = self.read.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)
        self._write_conn.close()
        self.read.close()

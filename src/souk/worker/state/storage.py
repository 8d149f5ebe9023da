"""The data directory as a place to write: whether it can take a commit now, and what to do when
it cannot.

A full or read-only file system must not lose work that was acknowledged: a step that cannot
commit is tried again once the cause clears (`StorageWatch.pause`), and a request that needs a
write is refused with the cause (`StorageFull`: 507 with the free space it needs), never a 500.
A data directory that cannot be used at all stops the worker at start with one line
(`DataDirUnusable`), not a traceback.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from souk.worker.errors import StorageFault, StorageFull

T = TypeVar("T")
log = logging.getLogger("souk.worker.storage")

# What the worker asks to be free before it writes again: room for a few hundred log entries.
HEADROOM = 1 << 20
RETRY_FIRST = 0.05
RETRY_MAX = 2.0

_SQLITE_FULL = {sqlite3.SQLITE_FULL}
_SQLITE_UNAVAILABLE = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN}
_ERRNO_FULL = {errno.ENOSPC, errno.EDQUOT}
_ERRNO_UNAVAILABLE = {errno.EROFS, errno.EIO}


class DataDirUnusable(Exception):
    """The data directory cannot be created, written or opened: the worker cannot start."""


def free_bytes(path: Path) -> int | None:
    """Space an unprivileged writer could still use there; None if it cannot be told."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _kind(exc: BaseException) -> str | None:
    """'full', 'unavailable' or None (not the storage's fault)."""
    if isinstance(exc, sqlite3.Error):
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF  # primary code
        if code in _SQLITE_FULL:
            return "full"
        return "unavailable" if code in _SQLITE_UNAVAILABLE else None
    if isinstance(exc, OSError):
        if exc.errno in _ERRNO_FULL:
            return "full"
        return "unavailable" if exc.errno in _ERRNO_UNAVAILABLE else None
    return None


class StorageWatch:
    """What the last write found (writable, or the fault that stopped it), shared by everyone who
    writes: requests learn the cause, steps wait it out."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.fault: StorageFault | None = None
        self.since: float | None = None  # wall-clock time of the first failed write
        self._cleared = asyncio.Event()

    def fault_from(self, exc: BaseException) -> StorageFault | None:
        """The storage fault behind `exc`, recorded; None when `exc` is something else."""
        if isinstance(exc, StorageFault):
            fault: StorageFault | None = exc
        else:
            fault = self._describe(exc)
        if fault is None:
            return None
        if self.fault is None:
            self.since = time.time()
            self._cleared = asyncio.Event()
            log.warning("%s; waiting for it to clear", fault.message)
        self.fault = fault
        return fault

    def _describe(self, exc: BaseException) -> StorageFault | None:
        kind = _kind(exc)
        if kind is None:
            return None
        free = free_bytes(self.data_dir)
        if kind == "full" or (free is not None and free < HEADROOM):
            details = {"free_bytes": free, "needed_bytes": HEADROOM}
            shown = "?" if free is None else f"{free} bytes"
            message = (
                f"the worker's data directory is full ({shown} free; it needs {HEADROOM >> 20}"
                " MiB to record changes): nothing was changed, retry once space is freed"
            )
            return StorageFull(message, details)
        return StorageFault(
            f"the worker's data directory cannot be written ({exc}): nothing was changed",
            {"error": str(exc)},
        )

    def cleared(self) -> None:
        """A commit went through: whatever stopped writes is gone."""
        if self.fault is not None:
            log.warning("the data directory takes writes again; resuming")
            self.fault = None
            self.since = None
            self._cleared.set()

    async def pause(self, attempt: int) -> None:
        """Before try number `attempt + 1` of a write that failed on the storage: a backoff that
        doubles up to `RETRY_MAX`, cut short as soon as any other write succeeds."""
        delay = min(RETRY_FIRST * 2 ** min(attempt, 16), RETRY_MAX)  # a bounded power: no overflow
        try:
            await asyncio.wait_for(self._cleared.wait(), delay)
        except TimeoutError:
            pass


async def patiently(watch: StorageWatch, attempt: Callable[[], Awaitable[T]]) -> T:
    """`attempt()` (a write) until no storage fault stops it: for what must be recorded sooner or
    later, such as an operation's failure or a process's exit."""
    waits = 0
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if watch.fault_from(exc) is None:
                raise
        await watch.pause(waits)
        waits += 1


def check_data_dir(path: Path) -> None:
    """Make the data directory if it is missing, and prove it takes a file; `DataDirUnusable`
    with the reason otherwise. A full one is usable: the worker starts and reports it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise DataDirUnusable(f"data dir {path}: not a directory") from exc
    except OSError as exc:
        raise DataDirUnusable(f"data dir {path}: cannot create it: {_reason(exc)}") from exc
    if not path.is_dir():
        raise DataDirUnusable(f"data dir {path}: not a directory")
    probe = path / f".probe-{uuid.uuid4().hex}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        if exc.errno in _ERRNO_FULL:  # usable once freed: start, and say so on each write
            return
        raise DataDirUnusable(f"data dir {path}: cannot write to it: {_reason(exc)}") from exc
    os.close(fd)
    probe.unlink(missing_ok=True)


def unusable(path: Path, exc: BaseException) -> DataDirUnusable:
    """An error opening the worker's database, as the one line the worker exits with."""
    return DataDirUnusable(f"data dir {path}: cannot open the worker's database: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__

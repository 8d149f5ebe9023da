"""Files that hold secrets (the cluster secret, tokens, keys) are written one way: mode 0600 from
the moment they exist, and atomically, so no reader ever sees one world-readable or half-written.
Other files written the same careful way (certificates) only choose another mode. A database of
an app's data (the worker's, the app registry's) is made 0600 before SQLite opens it
(`private_database`), whatever the umask: SQLite gives its side files the database's mode."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

SECRET_MODE = 0o600


def write_secret(path: Path, data: bytes | str, *, replace: bool = True) -> None:
    """Write `data` to `path` with mode 0600, atomically. With `replace=False` an existing file
    is left alone and FileExistsError raised (no window between the check and the create)."""
    write_file(path, data, mode=SECRET_MODE, replace=replace)


def write_file(path: Path, data: bytes | str, *, mode: int, replace: bool = True) -> None:
    """`write_secret` with another mode: the file never exists with a wider one."""
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # mkstemp's 0600 at first; the umask plays no part
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            tmp.unlink()
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _sync_dir(path.parent)


SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_database(path: Path) -> None:
    """Make `path` (an SQLite database, made empty if missing) and the side files SQLite keeps
    beside it 0600, and its directory, when made here, 0700: before the database is opened,
    which would create it with the umask's leave (0644 by default) and its side files alike."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _make_private(path, os.O_CREAT)  # also one made before, with the umask's mode
    for suffix in SQLITE_SIDE_FILES:
        with contextlib.suppress(FileNotFoundError):
            _make_private(path.with_name(path.name + suffix), 0)


def _make_private(path: Path, flags: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | flags, SECRET_MODE)
    try:
        os.fchmod(fd, SECRET_MODE)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    """fsync what `path` names, a file or a directory: opened read-only, which is all fsync
    needs, and closed whatever happens."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(directory: Path) -> None:
    """The rename itself survives a crash once the directory is synced (where it can be)."""
    with contextlib.suppress(OSError):
        fsync_path(directory)

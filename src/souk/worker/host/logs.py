"""A machine's stdout and stderr: files in its directory, kept within a size budget.

The process writes to its files directly (O_APPEND), so its output survives a worker crash; the
worker rotates a file that has grown past the budget: the current one becomes `.1` (the previous
`.1` is dropped) and writing goes on at the start of an empty file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import IO

from souk.node.periodic import every

STREAMS = ("stdout", "stderr")
log = logging.getLogger("souk.worker.logs")


@contextlib.contextmanager
def output_files(rundir: Path) -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """The machine's stdout and stderr files, open to append: the worker's own (0600), of which
    the process it starts gets only the descriptors."""
    with _append(rundir / "stdout.log") as out, _append(rundir / "stderr.log") as err:
        yield out, err


def _append(path: Path) -> IO[bytes]:
    return open(path, "ab", opener=lambda name, flags: os.open(name, flags, 0o600))


def rotate_if_large(rundir: Path, max_bytes: int) -> None:
    for stream in STREAMS:
        path, kept = rundir / f"{stream}.log", rundir / f"{stream}.log.1"
        try:
            if path.stat().st_size <= max_bytes:
                continue
            kept.unlink(missing_ok=True)  # its room first: the copy may need it
            try:
                shutil.copyfile(path, kept)
            except OSError as exc:
                kept.unlink(missing_ok=True)
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # no room for the copy on a full disk: free the space, lose the old output
            with open(path, "r+b") as f:
                f.truncate(0)
        except FileNotFoundError:
            continue


def rotate_all(machines_dir: Path, max_bytes: int) -> None:
    """`rotate_if_large` for every machine's directory; one machine's failure is logged and
    the others are rotated all the same."""
    try:
        rundirs = sorted(machines_dir.iterdir())
    except FileNotFoundError:  # no machine yet
        return
    except OSError as exc:
        log.warning("listing %s to rotate its logs: %s", machines_dir, exc)
        return
    for rundir in rundirs:
        try:
            rotate_if_large(rundir, max_bytes)
        except OSError as exc:
            log.warning("rotating the logs in %s: %s", rundir, exc)


async def rotate_forever(machines_dir: Path, max_bytes: int, interval: float = 1.0) -> None:
    # One thread hop a sweep, the listing in it too: a hop per machine (a thousand a second on
    # a full worker) and a listing on the loop were a steady cost and a stall for every request.
    def sweep() -> Awaitable[None]:
        return asyncio.to_thread(rotate_all, machines_dir, max_bytes)

    await every(interval, sweep, what="log rotation", log=log)


def read_tail(rundir: Path, stream: str, max_bytes: int) -> bytes:
    path = rundir / f"{stream}.log"
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read()
    except FileNotFoundError:
        return b""


async def follow(rundir: Path, stream: str, poll: float = 0.1) -> AsyncIterator[bytes]:
    """New output as it is written, across rotations, until the caller stops reading."""
    path = rundir / f"{stream}.log"
    offset = path.stat().st_size if path.exists() else 0
    while True:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < offset:  # rotated: start over at the beginning of the new file
            offset = 0
        if size > offset:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read(size - offset)
            offset += len(chunk)
            yield chunk
        else:
            await asyncio.sleep(poll)

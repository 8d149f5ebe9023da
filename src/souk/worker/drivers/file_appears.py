"""Waiting for a file to appear, on inotify: told the moment it is created or renamed into its
directory, rather than looking every few milliseconds (runc's pid file, which a container's
start waits on). One inotify instance serves every wait and is kept: closing one waits for an
RCU grace period (up to 15 ms measured here), which no start should pay; a watch is added for
each wait and removed after it (microseconds). Where inotify is not to be had, it looks every
`POLL` seconds instead."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import struct
from pathlib import Path
from typing import Any

POLL = 0.002
IN_MOVED_TO, IN_CREATE = 0x80, 0x100  # <sys/inotify.h>
_MASK = IN_CREATE | IN_MOVED_TO
_EVENT = struct.Struct("=iIII")  # wd, mask, cookie, len; then `len` bytes of name
_libc = ctypes.CDLL(None, use_errno=True)


class FileWatch:
    def __init__(self) -> None:
        self._fd: int | None = None
        self._waiting: dict[int, list[asyncio.Event]] = {}  # by watch descriptor

    async def appears(self, path: Path, unless: asyncio.Future[Any]) -> bool:
        """True once `path` exists; False if `unless` is done first (and `path` still
        missing)."""
        fd = self._opened()
        wd = -1 if fd is None else _libc.inotify_add_watch(fd, os.fsencode(path.parent), _MASK)
        if fd is None or wd < 0:
            while not path.exists():
                if unless.done():
                    return path.exists()
                await asyncio.sleep(POLL)
            return True
        event = asyncio.Event()  # something was made in the directory, or `unless` is done
        waiting = self._waiting.setdefault(wd, [])
        waiting.append(event)
        unless.add_done_callback(lambda _: event.set())
        try:
            while not path.exists():  # looked at after the watch began: no event is missed
                if unless.done():
                    return path.exists()
                await event.wait()
                event.clear()
            return True
        finally:
            waiting.remove(event)
            if not waiting:
                del self._waiting[wd]
                _libc.inotify_rm_watch(fd, wd)

    def _opened(self) -> int | None:
        if self._fd is None:
            fd = int(_libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
            if fd < 0:
                return None
            asyncio.get_running_loop().add_reader(fd, self._read, fd)
            self._fd = fd
        return self._fd

    def _read(self, fd: int) -> None:
        """Wakes the waits on each directory something was made in."""
        with contextlib.suppress(BlockingIOError):
            while data := os.read(fd, 65536):
                at = 0
                while at + _EVENT.size <= len(data):
                    wd, _mask, _cookie, size = _EVENT.unpack_from(data, at)
                    at += _EVENT.size + size
                    for event in self._waiting.get(wd, ()):
                        event.set()

    def close(self) -> None:
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

"""A suspended guest's memory, on disk rather than in the host's memory.

The guest's RAM is a memfd of qemu's (`-object memory-backend-memfd`, named as below). Suspend
pauses the guest (the monitor's `stop`), copies the memfd's pages to `memory.snap` in the
machine's directory (0600, sparse: pages never touched stay holes) and then punches them out of
the memfd, so the host has that memory back; qemu keeps only its own (the devices' and vCPUs'
state), in the same process, so the machine's process is the same before and after. Resume
writes the pages back, from a process in the machine's cgroups (charged for them, as the guest
was), and only then lets the guest run on.

Why not a migration stream to a file, restored into a new qemu: the machine's process would be
another one after a resume, and qemu 7 ends an outgoing migration by giving up its disks, which
fails on a qcow2 layer over a read-only base.

Every step is idempotent, for a worker killed midway: the snapshot is written under another name
and renamed whole before the memory is punched out; on resume it is removed once the pages are
back, before the guest runs (never a snapshot beside a guest that runs on)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

MEMFD = "/memfd:memory-backend-memfd"  # how qemu's RAM shows in /proc/<pid>/fd
CHUNK = 1 << 20
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


class SnapshotError(RuntimeError):
    pass


def memfd(pid: int) -> Path:
    """qemu's RAM as a path the worker (root) opens: its descriptor's link in /proc."""
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd).startswith(MEMFD):
                return fd
        except OSError:
            continue
    raise SnapshotError(f"qemu {pid} has no RAM of its own to save (no {MEMFD})")


def _ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """The data (not hole) ranges of `fd`."""
    found, at = [], 0
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
        except OSError:  # ENXIO: only holes from here
            break
        end = os.lseek(fd, start, os.SEEK_HOLE)
        found.append((start, end))
        at = end
    return found


def save(pid: int, snapshot: Path) -> int:
    """The guest's pages into `snapshot`, then out of the host's memory; the bytes written."""
    source = memfd(pid)
    written = 0
    if not snapshot.exists():
        tmp = snapshot.with_name(snapshot.name + ".tmp")
        src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(src).st_size
            os.ftruncate(dst, size)
            zero = bytes(CHUNK)
            for start, end in _ranges(src, size):
                for at in range(start, end, CHUNK):
                    chunk = os.pread(src, min(CHUNK, end - at), at)
                    if chunk != zero[: len(chunk)]:  # an untouched page stays a hole
                        os.pwrite(dst, chunk, at)
                        written += len(chunk)
            os.fsync(dst)
        finally:
            os.close(src)
            os.close(dst)
        os.replace(tmp, snapshot)
    punch(source)
    return written


def punch(source: Path) -> None:
    """Every page of the memfd out of memory: it reads as zeros until written again."""
    fd = os.open(source, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        if _libc.fallocate(fd, mode, 0, size) != 0:
            raise SnapshotError(f"punching the guest's memory: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def restore_argv(pid: int, snapshot: Path) -> list[str]:
    """What writes the snapshot's pages back into qemu's RAM (run in the machine's cgroups):
    `dd`, which seeks over the snapshot's zeros rather than writing them (they read as zeros)."""
    target = memfd(pid)
    return ["dd", f"if={snapshot}", f"of={target}", "bs=1M", "conv=sparse,notrunc", "status=none"]

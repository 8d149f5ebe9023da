"""Reading a file of an image's root filesystem as the container would see it: every symbolic
link on the way resolved inside the root (an absolute one from the root, `..` stopping at it),
so that a link the image or the machine put there (`etc/passwd -> /etc/shadow`) never makes the
worker, root on the host, read a host file.

`openat2(2)` with RESOLVE_IN_ROOT does that in the kernel (Linux 5.6); where it is missing, the
same walk is made here, one component at a time, each opened without following links. Only a
regular file is read (a FIFO would block the worker, a device read anything), and at most
`limit` bytes of it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import stat
from pathlib import Path

SYS_OPENAT2 = 437  # the same on every architecture a worker runs on
RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT = 0x02, 0x10
MAX_LINKS = 40  # as the kernel's own walk: a loop of links ends here (ELOOP)
RETRIES = 8  # openat2 says EAGAIN when a rename races its walk
LIMIT = 4 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_openat2: bool | None = None  # whether the kernel has it: learnt at the first call


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


class NotARegularFile(OSError):
    """What the path leads to inside the root is not a regular file."""


def read(root: Path, path: str, limit: int = LIMIT) -> bytes:
    """The bytes of `path` (absolute or not, as inside the root) below `root`; OSError if it
    is missing, not a regular file, or larger than `limit`."""
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = open_in_root(root_fd, path)
    finally:
        os.close(root_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(errno.EINVAL, f"{path}: not a regular file in the image")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{path}: over {limit} bytes")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 16, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"{path}: over {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_in_root(root_fd: int, path: str) -> int:
    """A read-only descriptor of `path` resolved inside the directory `root_fd` (not following
    a final link outside it either); O_NONBLOCK, so that a FIFO never blocks."""
    global _openat2
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    if _openat2 is not False:
        try:
            fd = _open_resolved(root_fd, path, flags)
            _openat2 = True
            return fd
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise
            _openat2 = False
    return walk(root_fd, path, flags)


def _open_resolved(root_fd: int, path: str, flags: int) -> int:
    how = _OpenHow(flags, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    name = os.fsencode(path.lstrip("/") or ".")
    for _ in range(RETRIES):
        fd = _libc.syscall(SYS_OPENAT2, root_fd, name, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code != errno.EAGAIN:
            break
    raise OSError(code, os.strerror(code), path)


def walk(root_fd: int, path: str, flags: int) -> int:
    """What openat2's RESOLVE_IN_ROOT does, in user space: each component opened with
    O_NOFOLLOW below the directory reached so far; a link's target is put in front of what is
    left, from the root if absolute; `..` goes up the directories walked, never above the
    root."""
    todo = [part for part in path.split("/") if part][::-1]  # the next component last
    stack = [os.dup(root_fd)]  # the directories walked; stack[0] is the root
    links = 0
    try:
        while todo:
            part = todo.pop()
            if part == ".":
                continue
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            last = not todo
            here = stack[-1]
            try:
                target = os.readlink(part, dir_fd=here)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: not a link
                    raise
            else:
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                todo.extend(part for part in target.split("/")[::-1] if part)
                if posixpath.isabs(target):
                    while len(stack) > 1:
                        os.close(stack.pop())
                continue
            if last:
                return os.open(part, flags | os.O_NOFOLLOW, dir_fd=here)
            opened = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=here)
            stack.append(opened)
        return os.dup(stack[-1])  # the root itself, or a directory the path ends on
    finally:
        for fd in stack:
            os.close(fd)

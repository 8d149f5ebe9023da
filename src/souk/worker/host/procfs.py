"""Reading /proc: a process's identity (pid and start time) and the environment marker that lets a
restarted worker find the processes it started before it crashed."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
ENVIRON_READ = 1 << 16


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: with the pid, a unique name for a process across pid reuse."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):  # gone, or exited and not yet reaped
        return None
    return fields[19]


def children(parent: int) -> list[int]:
    """The processes whose parent is `parent`, those exited and not yet reaped included."""
    found = []
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[1] == str(parent):
                found.append(int(entry.name))
    return found


def program(pid: int) -> str | None:
    """The file the process runs; None once it is gone (or has exited)."""
    try:
        return os.readlink(PROC / str(pid) / "exe")
    except OSError:
        return None


def arguments(pid: int) -> list[bytes] | None:
    """The process's command line, its argv (empty for a moment while an exec lays out the
    new one); None once it is gone."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return None


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the third (the state) on: the second, the command's name
    in parentheses, may hold spaces."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def is_alive(pid: int, pid_start: str) -> bool:
    return start_time(pid) == pid_start


def has_marker(pid: int, marker: str) -> bool:
    environ = _environ(str(pid))
    return environ is not None and _carries(environ, f"SOUK_MARKER={marker}".encode())


def find_by_marker(marker: str) -> int | None:
    """The process-group leader whose environment carries this marker."""
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if os.getpgid(pid) != pid:
                continue
        except OSError:
            continue
        if has_marker(pid, marker):
            return pid
    return None


def processes_of(machine_id: str, among: Iterable[int] | None = None) -> list[int]:
    """Live processes whose environment names this machine: its own and whatever they started,
    in its process group or not; of the pids `among`, or of every process of the host. Each
    environment read costs a few microseconds: run it off the event loop (`ProcessDriver`)."""
    variable = f"SOUK_MACHINE_ID={machine_id}".encode()
    found: list[int] = []
    names = os.listdir(PROC) if among is None else [str(pid) for pid in among]
    for name in names:
        if not name.isdigit():
            continue
        environ = _environ(name)
        if (
            environ is not None
            and _carries(environ, variable)
            and start_time(int(name)) is not None
        ):
            found.append(int(name))
    return found


def _carries(environ: bytes, variable: bytes) -> bool:
    """Whether `NAME=value` is one of the environment's variables (each ends in a NUL), not a
    piece of one: found without splitting the environment into a list first."""
    return (
        environ.startswith(variable + b"\0")
        or b"\0" + variable + b"\0" in environ
        or environ.endswith(b"\0" + variable)
        or environ == variable
    )


def _environ(pid: str) -> bytes | None:
    """/proc/PID/environ by plain system calls (pathlib's layers cost as much as the read)."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, ENVIRON_READ):
            chunks.append(chunk)
            if len(chunk) < ENVIRON_READ:  # procfs fills a read up to the environment's end
                break
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)

"""Reading /proc: a process's identity (pid and start time) and the environment marker that lets a
restarted worker find the processes it started before it crashed."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: with the pid, a unique name for a process across pid reuse."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped
        return None
    return fields[19]


def is_alive(pid: int, pid_start: str) -> bool:
    return start_time(pid) == pid_start


def has_marker(pid: int, marker: str) -> bool:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"SOUK_MARKER={marker}".encode() in environ.split(b"\0")


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


def processes_of(machine_id: str) -> list[int]:
    """Live processes whose environment names this machine: its own and whatever they started,
    in its process group or not (a reading of every process's environment: not for hot paths)."""
    wanted = f"SOUK_MACHINE_ID={machine_id}".encode()
    found: list[int] = []
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0") and start_time(int(entry.name)) is not None:
            found.append(int(entry.name))
    return found

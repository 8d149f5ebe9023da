"""Machines' processes, found by the `SOUK_MACHINE_ID` in their environment.

They deliberately outlive their worker (a crashed worker adopts them when it comes back), so
tearing a worker down is not enough to clean up after it: whatever names one of its machines is
killed here."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from souk.worker.oci import network

CGROUPS = Path("/sys/fs/cgroup")


def is_running(pid: int) -> bool:
    """Alive, not a zombie (nothing reaps orphans here, so exited ones may linger as Z)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def machine_processes(ids: set[str]) -> list[int]:
    """Live pids whose environment names one of these machines."""
    wanted = {f"SOUK_MACHINE_ID={i}".encode() for i in ids}
    found: list[int] = []
    if not wanted:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if wanted.intersection(environ.split(b"\0")) and is_running(int(entry.name)):
            found.append(int(entry.name))
    return found


def live_pids(machine_id: str) -> list[int]:
    return machine_processes({machine_id})


def kill_machine_processes(ids: set[str]) -> None:
    """SIGKILL to every process (and its group) left running for these machines; then their
    cgroups (`remove_groups`)."""
    for pid in machine_processes(ids):
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
    remove_groups(ids)


def remove_groups(ids: set[str]) -> None:
    """These machines' cgroups and network namespaces, which a worker removes only when it
    destroys a machine, once their processes (killed) are gone."""
    for machine_id in ids:
        network.remove(machine_id)
    groups = [
        g
        for i in ids
        for pattern in (f"*/souk/*/{i}", f"souk/*/{i}")
        for g in CGROUPS.glob(pattern)
    ]
    deadline = time.monotonic() + 2
    while groups and time.monotonic() < deadline:
        for group in list(groups):
            with contextlib.suppress(FileNotFoundError):
                try:
                    group.rmdir()
                except OSError:  # its killed processes are not gone yet
                    continue
            groups.remove(group)
        if groups:
            time.sleep(0.02)


def recorded_ids(db_path: Path) -> set[str]:
    """Every machine id in a worker's database, read-only (none if it cannot be read)."""
    if not db_path.exists():
        return set()
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
            return {row[0] for row in conn.execute("SELECT id FROM machines")}
    except sqlite3.Error:
        return set()


def api_pid(machine: dict[str, Any]) -> int | None:
    """The pid the worker reports for the machine's current process: its newest spawn or
    adoption event (events come newest first)."""
    for event in machine["events"]:
        if event["step"] in ("spawn", "adopted"):
            pid = event["request"].get("pid")
            return int(pid) if pid is not None else None
    return None


def integrity(db_path: Path) -> str:
    """SQLite's own verdict on a worker's database ("ok" when intact)."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])

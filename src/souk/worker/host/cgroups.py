"""CPU and memory limits through cgroups, where the host lets us write them (v1 or v2)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger("souk.worker.cgroups")

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
FREEZE_POLL = 0.0005
FREEZE_TIMEOUT = 10.0


def detect() -> str:
    """'v2', 'v1' or 'none': which cgroup hierarchy we can write to."""
    if (ROOT / "cgroup.controllers").exists():
        return "v2" if os.access(ROOT, os.W_OK) else "none"
    if os.access(ROOT / "memory", os.W_OK) and os.access(ROOT / "cpu", os.W_OK):
        return "v1"
    return "none"


def freezer_mode() -> str:
    """'v2', 'v1' or 'none': how a machine's processes can be frozen (suspend)."""
    if (ROOT / "cgroup.controllers").exists():
        return "v2" if os.access(ROOT, os.W_OK) else "none"
    return "v1" if os.access(ROOT / "freezer", os.W_OK) else "none"


def _own_group(mode: str) -> Path | None:
    """This process's group directory: the unified one (v2) or the memory controller's (v1),
    from /proc/self/cgroup (read each time: nothing stops the host from moving the worker)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (mode == "v2" and controllers == "") or (
            mode == "v1" and "memory" in controllers.split(",")
        ):
            return ROOT.joinpath(*([] if mode == "v2" else ["memory"]), path.lstrip("/"))
    return None


def worker_group(worker: str) -> str:
    """The group under which a worker's machines get theirs, with both drivers."""
    return f"souk/{worker}"


class FreezeError(RuntimeError):
    pass


class Cgroups:
    def __init__(self, group: str) -> None:
        self.mode = detect()
        self.freezer = freezer_mode()
        self.group = group  # e.g. souk/<worker name>

    def _freezer_dir(self, machine_id: str) -> Path | None:
        if self.freezer == "v2":
            return ROOT / self.group / machine_id
        if self.freezer == "v1":
            return ROOT / "freezer" / self.group / machine_id
        return None

    def _own_freezer(self, machine_id: str) -> Path | None:
        """The machine's freezer group where it is a group of its own (v1; in v2 the machine's
        one group is also its freezer)."""
        return self._freezer_dir(machine_id) if self.freezer == "v1" else None

    def _groups(self, machine_id: str) -> list[Path]:
        """Every group of the machine: its limits' and its own freezer."""
        freezer = self._own_freezer(machine_id)
        return [*self._dirs(machine_id), *([freezer] if freezer else [])]

    def procs_files(self, machine_id: str) -> list[Path]:
        """The machine's `cgroup.procs` files (limits and freezer), where they exist: what a
        process joins to be counted, limited and frozen with the machine."""
        return [d / "cgroup.procs" for d in self._groups(machine_id) if d.is_dir()]

    def can_freeze(self, machine_id: str) -> bool:
        d = self._freezer_dir(machine_id)
        return d is not None and d.is_dir()

    async def freeze(self, machine_id: str, frozen: bool = True) -> None:
        """Freeze (or thaw) every process in the machine's group, and return once the kernel
        says it is done: a v1 group passes through FREEZING while tasks are caught. A group
        removed meanwhile (its last process gone: runc removes a container's) has nothing left
        to thaw, and nothing to freeze."""
        d = self._freezer_dir(machine_id)
        if d is None:
            raise FreezeError("this host gives the worker no cgroup freezer")
        try:
            await self._freeze(d, frozen)
        except OSError as exc:
            if d.is_dir():
                raise
            if frozen:
                raise FreezeError(f"{d.name}: its group is gone") from exc

    async def _freeze(self, d: Path, frozen: bool) -> None:
        deadline = time.monotonic() + FREEZE_TIMEOUT
        if self.freezer == "v2":
            (d / "cgroup.freeze").write_text("1" if frozen else "0")
            want = f"frozen {1 if frozen else 0}"
            while want not in (d / "cgroup.events").read_text().splitlines():
                self._give_up(d, frozen, deadline)
                await asyncio.sleep(FREEZE_POLL)
            return
        state = "FROZEN" if frozen else "THAWED"
        (d / "freezer.state").write_text(state)
        while (d / "freezer.state").read_text().strip() != state:
            self._give_up(d, frozen, deadline)
            await asyncio.sleep(FREEZE_POLL)
            (d / "freezer.state").write_text(state)  # v1 may need asking again

    def _give_up(self, d: Path, frozen: bool, deadline: float) -> None:
        """A group that will not freeze in time (a task stuck in the kernel) is thawed again
        rather than left half frozen, and the suspend fails."""
        if time.monotonic() < deadline:
            return
        if frozen:
            if self.freezer == "v2":
                (d / "cgroup.freeze").write_text("0")
            else:
                (d / "freezer.state").write_text("THAWED")
        raise FreezeError(f"{d.name}: the kernel did not {'freeze' if frozen else 'thaw'} it")

    def _dirs(self, machine_id: str) -> list[Path]:
        if self.mode == "v2":
            return [ROOT / self.group / machine_id]
        if self.mode == "v1":
            return [ROOT / c / self.group / machine_id for c in ("memory", "cpu")]
        return []

    def prepare(self, machine_id: str, cpus: int, memory_mb: int) -> list[Path]:
        """The machine's groups made, under its limits: the `cgroup.procs` files its process
        joins before its command runs; none where the host gives us no cgroups, or where they
        could not be made (the machine then runs without them, as the warning says). Plain
        system calls: it is on every start's way."""
        dirs = self._dirs(machine_id)
        try:
            for d in dirs:
                _make(d)
            if self.mode == "v2":
                _write(dirs[0] / "memory.max", memory_mb << 20)
                _write(dirs[0] / "cpu.max", f"{cpus * PERIOD_US} {PERIOD_US}")
            elif self.mode == "v1":  # a new group's period is the kernel's default, PERIOD_US
                _write(dirs[0] / "memory.limit_in_bytes", memory_mb << 20)
                _write(dirs[1] / "cpu.cfs_quota_us", cpus * PERIOD_US)
        except OSError as exc:
            log.warning("cgroup limits for %s not applied: %s", machine_id, exc)
            return []
        freezer = self._own_freezer(machine_id)
        if freezer is not None:
            try:
                _make(freezer)
                dirs.append(freezer)
            except OSError as exc:
                log.warning("freezer group for %s not made: %s", machine_id, exc)
        return [d / "cgroup.procs" for d in dirs]

    def outside(self) -> set[int] | None:
        """The processes of the worker's own group, in the hierarchy that holds the machines'
        limits (memory in v1, the one in v2): where a machine's process is born, and stays if
        its own groups could not be made. None where machines get no groups: any process of
        the host may then be one of theirs."""
        if self.mode == "none":
            return None
        path = _own_group(self.mode)
        if path is None:
            return None
        try:
            return {int(p) for p in (path / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            return None

    def pids(self, machine_id: str) -> set[int]:
        """Processes in the machine's cgroups, wherever they moved in the process tree."""
        found: set[int] = set()
        for d in self._dirs(machine_id):
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return found

    def kill(self, machine_id: str) -> int:
        """SIGKILL to every process of the machine's groups, then a thaw (not waited for): a
        task of a frozen v1 group cannot die until thawed, and dies before it runs again.
        Plain system calls, for whoever cannot wait; returns how many were signalled."""
        pids = self.pids(machine_id)
        freezer = self._freezer_dir(machine_id)
        if freezer is not None and self.freezer == "v1":
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in (freezer / "cgroup.procs").read_text().split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freezer is not None:
            state, value = (
                ("cgroup.freeze", "0") if self.freezer == "v2" else ("freezer.state", "THAWED")
            )
            with contextlib.suppress(OSError):
                _write(freezer / state, value)
        return len(pids)

    def remove(self, machine_id: str) -> None:
        for d in self._groups(machine_id):
            try:
                d.rmdir()  # only works once its processes are gone, which is when we call it
            except OSError:
                pass


def _make(d: Path) -> None:
    """The group, and the worker's own above it the first time."""
    try:
        os.mkdir(d)
    except FileExistsError:
        pass
    except FileNotFoundError:
        d.mkdir(parents=True, exist_ok=True)


def _write(path: Path, value: object) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)

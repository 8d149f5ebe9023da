"""CPU and memory limits through cgroups, where the host lets us write them (v1 or v2)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("souk.worker.cgroups")

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def detect() -> str:
    """'v2', 'v1' or 'none': which cgroup hierarchy we can write to."""
    if (ROOT / "cgroup.controllers").exists():
        return "v2" if os.access(ROOT, os.W_OK) else "none"
    if os.access(ROOT / "memory", os.W_OK) and os.access(ROOT / "cpu", os.W_OK):
        return "v1"
    return "none"


class Cgroups:
    def __init__(self, group: str) -> None:
        self.mode = detect()
        self.group = group  # e.g. souk/<worker name>

    def _dirs(self, machine_id: str) -> list[Path]:
        if self.mode == "v2":
            return [ROOT / self.group / machine_id]
        if self.mode == "v1":
            return [ROOT / c / self.group / machine_id for c in ("memory", "cpu")]
        return []

    def limit(self, machine_id: str, pid: int, cpus: int, memory_mb: int) -> bool:
        """Put `pid` under limits; False where the host gives us no cgroups."""
        try:
            if self.mode == "v2":
                (d,) = self._dirs(machine_id)
                d.mkdir(parents=True, exist_ok=True)
                (d / "memory.max").write_text(str(memory_mb << 20))
                (d / "cpu.max").write_text(f"{cpus * PERIOD_US} {PERIOD_US}")
                (d / "cgroup.procs").write_text(str(pid))
            elif self.mode == "v1":
                mem, cpu = self._dirs(machine_id)
                for d in (mem, cpu):
                    d.mkdir(parents=True, exist_ok=True)
                (mem / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
                (cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (cpu / "cpu.cfs_quota_us").write_text(str(cpus * PERIOD_US))
                for d in (mem, cpu):
                    (d / "cgroup.procs").write_text(str(pid))
            else:
                return False
        except OSError as exc:
            log.warning("cgroup limits for %s not applied: %s", machine_id, exc)
            return False
        return True

    def pids(self, machine_id: str) -> set[int]:
        """Processes in the machine's cgroups, wherever they moved in the process tree."""
        found: set[int] = set()
        for d in self._dirs(machine_id):
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return found

    def remove(self, machine_id: str) -> None:
        for d in self._dirs(machine_id):
            try:
                d.rmdir()  # only works once its processes are gone, which is when we call it
            except OSError:
                pass

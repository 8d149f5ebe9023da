"""A worker's settings, from its command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from souk.models.machine import CpuKind
from souk.models.wire import DEFAULT_PRIVATE_PREFIX


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    name: str
    region: str
    data_dir: Path
    cpus: int
    memory_mb: int
    cpu_kinds: tuple[CpuKind, ...] = ("shared",)
    disk_mb: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    address: str = ""  # base URL others reach the HTTP API at
    durable: bool = True  # fsync every commit
    log_max_bytes: int = 1 << 20  # per stream, per machine; one rotated file is kept
    insecure_registries: tuple[str, ...] = ()  # host[:port] reached over plain http
    private_registries: tuple[str, ...] = ()  # host[:port] reached on a private address
    image_cache_mb: int | None = None  # the image cache's budget; None: unbounded
    metrics: bool = True  # False: hot paths record no metrics (benchmarks measure their cost)
    private_prefix: str = DEFAULT_PRIVATE_PREFIX  # the cluster's /48 of private addresses
    mesh_port: int | None = None  # UDP port of its WireGuard; None: not on the mesh
    mesh_endpoint: str | None = None  # host:port other nodes reach that port at

    @property
    def db_path(self) -> Path:
        return self.data_dir / "worker.db"

    def rundir(self, machine_id: str) -> Path:
        return self.data_dir / "machines" / machine_id

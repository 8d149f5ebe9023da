"""Rows replicated by the catalog. Each row has exactly one owner (its writer) and a version: the
owner's operation-log sequence number at the commit that last changed it."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from souk.models.capacity import Capacity
from souk.models.machine import CpuKind, Machine, MachineMetrics, MachineState
from souk.models.secrets import SecretRecord
from souk.models.wire import NETWORK_KEY


class Row(BaseModel):
    """Sequences in rows are tuples: a replica holds a row per worker and per machine of the
    fleet and replaces one at each change. Python's collector walks a list at every collection
    that reaches it, a tuple of strings or numbers only at its first (an empty one never), and
    in a big fleet the rows a replica churned are what sets its longest pauses
    (docs/benchmarks.md, "Catalog at 10,000 owners").

    A field a row does not know is ignored, not refused: rows come from their owners, and in a
    rolling upgrade an owner one protocol version ahead may write a field this release does not
    know yet (`souk.models.wire.PROTOCOL`). Releases before protocol 1 refused such rows, so a
    row gains a field only from protocol 2 on."""

    model_config = ConfigDict(extra="ignore")


class MeshPeer(BaseModel):
    """A node on the WireGuard mesh (docs/network.md): its public key, where its WireGuard
    listens (host:port), and its own address on the mesh."""

    model_config = ConfigDict(extra="ignore")
    public_key: str = Field(min_length=44, max_length=44)
    endpoint: str = Field(min_length=3, max_length=300)
    address: str = Field(max_length=45)


class WorkerRow(Row):
    id: str = Field(min_length=1, max_length=128)
    region: str = Field(min_length=1, max_length=32)
    address: str  # base URL of the worker's HTTP API
    cpu_kinds: tuple[CpuKind, ...]
    cpus_total: int = Field(ge=0)
    memory_mb_total: int = Field(ge=0)
    cpus_reserved: int = Field(ge=0)
    memory_mb_reserved: int = Field(ge=0)
    machines: int = Field(0, ge=0)
    disk_mb_total: int = Field(0, ge=0)
    disk_mb_reserved: int = Field(0, ge=0)
    volumes_refused: str | None = None  # why it makes no volumes (no root, no loop devices)
    labels: dict[str, str] = Field(default_factory=dict)
    cordoned: bool = False
    draining: bool = False
    epoch: str
    # On the mesh: left out of the row when None, so that a replica of the release before
    # (which refuses a field it does not know) reads the rows of a worker without a mesh.
    mesh: MeshPeer | None = None
    # Set by the replica that serves the row, never by its owner: how recently it was heard from.
    unreachable: bool = False
    last_heartbeat: float | None = None  # unix time

    @property
    def cpus_free(self) -> int:
        return self.cpus_total - self.cpus_reserved

    @property
    def memory_mb_free(self) -> int:
        return self.memory_mb_total - self.memory_mb_reserved

    @property
    def disk_mb_free(self) -> int:
        return self.disk_mb_total - self.disk_mb_reserved


class MachineRow(Row):
    id: str = Field(min_length=1, max_length=64)
    app: str
    region: str
    worker_id: str
    name: str = ""
    state: MachineState
    instance_id: str
    cpu_kind: CpuKind
    cpus: int = Field(ge=1)
    memory_mb: int = Field(ge=1)
    image: str | None = None
    private_ip: str | None = None
    # internal ports of its services, reachable at private_ip
    ports: tuple[int, ...] = ()
    standby_for: tuple[str, ...] = ()
    metadata: dict[str, str] = Field(default_factory=dict)
    metrics: MachineMetrics | None = None  # where its own metrics are scraped (Fly's)
    updated_at: str


class ImageRow(Row):
    worker_id: str
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    ref: str = ""
    size: int = Field(0, ge=0)


class AppRow(Row):
    name: str
    org: str = "personal"
    created_at: str
    deleted: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    # sealed (see `souk.models.secrets`)
    secrets: dict[str, SecretRecord] = Field(default_factory=dict)
    secrets_version: int = 0

    @property
    def network(self) -> str:
        """Its private network, `<org>/<name>`: the org's `default` unless it was created on
        another (docs/network.md)."""
        return f"{self.org}/{self.metadata.get(NETWORK_KEY) or 'default'}"


class VolumeRow(Row):
    """A volume, owned by the worker that holds it: any broker lists it and places by it."""

    id: str
    app: str
    name: str
    region: str
    worker_id: str
    state: str
    size_mb: int = Field(ge=0)
    attached_machine_id: str | None = None
    created_at: str


class RevocationRow(Row):
    """A revoked token id, written by the app registry; every broker refuses the token."""

    id: str = Field(pattern=r"^[0-9a-f]{16}$")
    revoked_at: str


def worker_row(cap: Capacity, address: str, epoch: str = "static") -> WorkerRow:
    return WorkerRow(
        id=cap.worker,
        region=cap.region,
        address=address,
        cpu_kinds=tuple(cap.cpu_kinds),
        cpus_total=cap.total.cpus,
        memory_mb_total=cap.total.memory_mb,
        cpus_reserved=cap.reserved.cpus,
        memory_mb_reserved=cap.reserved.memory_mb,
        machines=cap.machines,
        disk_mb_total=cap.disk_mb_total,
        disk_mb_reserved=cap.disk_mb_reserved,
        volumes_refused=cap.volumes_refused,
        labels=cap.labels,
        cordoned=cap.cordoned,
        draining=cap.draining,
        epoch=epoch,
    )


def machine_row(m: Machine) -> MachineRow:
    guest = m.config.guest
    return MachineRow(
        id=m.id,
        app=m.app,
        region=m.region,
        worker_id=m.worker,
        name=m.name,
        state=m.state,
        instance_id=m.instance_id,
        cpu_kind=guest.cpu_kind,
        cpus=guest.cpus,
        memory_mb=guest.memory_mb,
        image=m.config.image,
        private_ip=m.private_ip,
        ports=tuple(service.internal_port for service in m.config.services),
        standby_for=tuple(m.config.standbys),
        metadata=m.config.metadata,
        metrics=m.config.metrics,
        updated_at=m.updated_at,
    )


Table = Literal["workers", "machines", "images", "volumes", "apps", "revocations"]
TABLE_NAMES = frozenset(get_args(Table))  # what the catalog replicates
ROW_MODELS: dict[str, type[Row]] = {
    "workers": WorkerRow,
    "machines": MachineRow,
    "images": ImageRow,
    "volumes": VolumeRow,
    "apps": AppRow,
    "revocations": RevocationRow,
}


class RowChange(BaseModel):
    """One change as a replica applied it. `lseq` is the replica's own sequence of applied
    changes (a subscriber resumes from it); `seq` is the owner's version of the row."""

    lseq: int
    table: str
    key: str
    owner: str
    seq: int
    row: dict[str, Any] | None  # None: the row was deleted

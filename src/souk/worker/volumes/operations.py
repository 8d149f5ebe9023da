"""Volumes on this worker: accepting their operations, and a volume as the operation engine runs
it (`VOLUMES`).

The same discipline as machines: a request is decided and recorded in one transaction (the disk
is reserved against `--disk-mb` there, so two creates never both take the last of it), queued,
then run by the one runner a step at a time from `fsm.VOLUME_OPERATIONS` (steps.py), each step
logged as it completes.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from souk.models.fit import disk_misfit
from souk.models.machine import MachineConfig
from souk.models.volume import (
    CreateVolume,
    UpdateVolumeRequest,
    Volume,
    VolumeSnapshot,
    VolumeState,
    size_gb_of,
)
from souk.worker.errors import Conflict, Cordoned, InvalidState, NoRoom, WorkerError
from souk.worker.ops.fsm import VOLUME, VOLUME_OPERATIONS, VolumeOperation
from souk.worker.ops.progress import Kind, StepRun, enqueue
from souk.worker.settings import WorkerSettings
from souk.worker.state import queries, volume_queries
from souk.worker.state.operations import VOLUME_QUEUE
from souk.worker.state.queries import Db
from souk.worker.state.store import Tx, now_iso
from souk.worker.volumes import disk as volume_disk
from souk.worker.volumes.steps import VolumeHost

NO_DISK = "it offers no disk (start it with --disk-mb)"


class VolumeUnavailable(NoRoom):
    """A machine names a volume this worker cannot give it (not here, or another app's)."""

    reason = "volume_unavailable"


class VolumeAttached(Conflict):
    """The volume is mounted by a machine: one machine at a time, and never destroyed under it."""

    reason = "volume_attached"


class VolumeBusy(Conflict):
    """The machine mounting the volume is between states: ask again once it is settled."""

    reason = "volume_busy"


class VolumeFailed(WorkerError):
    """A step of the volume's operation failed on this host (a tool's error): the request was
    recorded, the volume is left as far as it got."""

    reason = "volume_failed"


def new_snapshot_id(volume_id: str) -> str:
    """Names its volume (`vs_<volume>_<n>`), so a broker knows which worker holds it."""
    return f"vs_{volume_id.removeprefix('vol_')}_{secrets.token_hex(4)}"


# --- admission: one transaction decides and records -------------------------------------------


def disk(db: Db, settings: WorkerSettings) -> tuple[int, int]:
    """(offered, reserved) MB of disk for volumes."""
    return settings.disk_mb or 0, volume_queries.reserved_disk_mb(db)


def _check_fits(db: Db, settings: WorkerSettings, grow_mb: int, refused: str | None) -> None:
    offered, reserved = disk(db, settings)
    if settings.disk_mb is None and refused is None:
        refused = NO_DISK
    found = disk_misfit(
        grow_mb, disk_mb_free=offered - reserved, volumes_refused=refused,
        cordoned=queries.cordoned(db),
    )  # fmt: skip
    if found is None:
        return
    message = f"worker {settings.name}: {found.reason}"
    if found.kind == "cordoned":
        raise Cordoned(message)
    details = {"disk_mb_free": offered - reserved, "asked_mb": grow_mb}
    raise NoRoom(message, details if found.kind == "room" else {"reason": found.reason})


def _failed(host: VolumeHost, tx: Tx, run: StepRun, state: str) -> str:
    """A failed operation leaves the volume as far as it got; a failed growth gives back what
    did not grow, and leaves the volume usable."""
    if run.op.name != "extend":
        return state
    row = volume_queries.existing_volume(tx, run.resource)
    have = host.paths(run.resource).image
    size = have.stat().st_size >> 20 if have.exists() else row["size_mb"]
    state = "created" if state == "extending" else state
    changes = {"size_mb": min(size, row["size_mb"]), "state": state}
    volume_queries.set_volume_columns(tx, run.resource, changes)
    return state


VOLUMES = Kind(VOLUME, VOLUME_QUEUE, _failed)


def _enqueue(tx: Tx, volume_id: str, op: VolumeOperation, params: dict[str, Any]) -> int:
    projected = volume_queries.existing_volume(tx, volume_id)["projected"]
    return enqueue(tx, VOLUMES, volume_id, op, projected, params)


def create(tx: Tx, settings: WorkerSettings, req: CreateVolume, refused: str | None) -> int:
    if volume_queries.volume(tx, req.id) is not None:
        raise Conflict(f"volume {req.id} already exists")
    size_mb, op, params = req.size_mb, VOLUME_OPERATIONS["create"], {}
    if req.snapshot_id is not None:
        snap = volume_queries.snapshot(tx, req.snapshot_id)
        if snap is None:
            raise VolumeUnavailable(f"no snapshot {req.snapshot_id} on worker {settings.name}")
        source = volume_queries.existing_volume(tx, snap["volume"])
        if source["app"] != req.app:
            raise VolumeUnavailable(f"snapshot {req.snapshot_id} belongs to another app")
        at_least = -(-snap["volume_size"] // (1 << 20))
        size_mb = max(size_mb or 0, at_least)
        op = VOLUME_OPERATIONS["restore"]
        params = {"snapshot": req.snapshot_id, "source": snap["volume"]}
    assert size_mb is not None  # the model requires one or the other
    _check_fits(tx, settings, size_mb, refused)
    state = "restoring" if op.name == "restore" else "creating"
    volume_queries.insert_volume(
        tx, req.id, req.name, req.app, state, size_mb, req.snapshot_retention, now_iso()
    )
    tx.log("volume", req.id, op.name, "reserve", state, data={"app": req.app, "size_mb": size_mb})
    return _enqueue(tx, req.id, op, {**params, "size_mb": size_mb})


SETTLED = ("created", "started", "stopped", "suspended")  # an attached machine's, for an extend


def _projected(row: Any) -> VolumeState:
    state: VolumeState = row["projected"]
    return state


def extend(tx: Tx, settings: WorkerSettings, volume_id: str, size_mb: int) -> int:
    row = volume_queries.existing_volume(tx, volume_id)
    if _projected(row) not in VOLUME_OPERATIONS["extend"].allowed_from:
        raise InvalidState(f"volume {volume_id} is {row['projected']}: cannot extend it")
    if size_mb < row["size_mb"]:
        raise InvalidState(
            f"volume {volume_id} has {row['size_mb']} MB: a volume only grows",
            {"size_mb": row["size_mb"]},
        )
    _machine_settled(tx, volume_id, row["attached_machine"])
    # the same size again finishes a growth that failed half-way (the file grown, not the fs)
    _check_fits(tx, settings, size_mb - row["size_mb"], None)  # growth on a worker that has it
    volume_queries.set_volume_columns(tx, volume_id, {"size_mb": size_mb, "updated_at": now_iso()})
    return _enqueue(tx, volume_id, VOLUME_OPERATIONS["extend"], {"size_mb": size_mb})


def _machine_settled(tx: Tx, volume_id: str, machine_id: str | None) -> None:
    """An extend waits for no machine: while the one mounting the volume is between states (a
    stop unmounting it, a start mounting it), growing it would race them (an offline grow finds
    the file system "in use" and leaves it unmounted), so the client is told to ask again."""
    if not machine_id:
        return
    machine = queries.existing_machine(tx, machine_id)
    if machine["state"] != machine["projected"] or machine["state"] not in SETTLED:
        raise VolumeBusy(
            f"volume {volume_id} is mounted by machine {machine_id}, which is"
            f" {machine['state']} (to be {machine['projected']}): extend once it is"
            f" {machine['projected']}",
            {"machine": machine_id, "state": machine["state"]},
        )


def snapshot(tx: Tx, volume_id: str) -> tuple[str, int]:
    row = volume_queries.existing_volume(tx, volume_id)
    if _projected(row) not in VOLUME_OPERATIONS["snapshot"].allowed_from:
        raise InvalidState(f"volume {volume_id} is {row['projected']}: cannot snapshot it")
    snapshot_id = new_snapshot_id(volume_id)
    op_id = _enqueue(tx, volume_id, VOLUME_OPERATIONS["snapshot"], {"snapshot": snapshot_id})
    return snapshot_id, op_id


def destroy(tx: Tx, volume_id: str) -> int | None:
    """Queue the destroy; None if it is already on its way. Refused while a machine mounts it."""
    row = volume_queries.existing_volume(tx, volume_id)
    if row["attached_machine"]:
        machine = row["attached_machine"]
        raise VolumeAttached(
            f"volume {volume_id} is mounted by machine {machine}: destroy the machine first",
            {"machine": machine},
        )
    if _projected(row) == "destroyed":
        return None
    return _enqueue(tx, volume_id, VOLUME_OPERATIONS["destroy"], {})


def update(tx: Tx, volume_id: str, req: UpdateVolumeRequest) -> None:
    volume_queries.existing_volume(tx, volume_id)
    if req.snapshot_retention is not None:
        volume_queries.set_volume_columns(
            tx, volume_id, {"snapshot_retention": req.snapshot_retention, "updated_at": now_iso()}
        )
        tx.log("volume", volume_id, "update", "retention", None, data=req.model_dump())


def attach(
    tx: Tx, settings: WorkerSettings, app: str, machine_id: str, config: MachineConfig
) -> None:
    """Give the machine the volumes its config mounts, in the transaction that records it: each
    must be here, the app's, made, and mounted by no other machine. Volumes it no longer names
    are let go."""
    wanted = {m.volume for m in config.mounts}
    for volume_id in volume_queries.volumes_attached_to(tx, machine_id):
        if volume_id not in wanted:
            volume_queries.set_volume_columns(tx, volume_id, {"attached_machine": None})
            tx.log("volume", volume_id, "detach", "machine", None, data={"machine": machine_id})
    for volume_id in sorted(wanted):
        row = volume_queries.volume(tx, volume_id)
        if row is None or row["state"] == "destroyed" or row["app"] != app:
            raise VolumeUnavailable(
                f"volume {volume_id} is not on worker {settings.name}"
                + ("" if row is None or row["app"] == app else f" for app {app}"),
                {"volume": volume_id, "worker": settings.name},
            )
        if row["projected"] == "destroyed" or row["state"] not in ("created", "extending"):
            raise InvalidState(
                f"volume {volume_id} is {row['state']}: a machine mounts a volume once it is made",
                {"volume": volume_id, "state": row["state"]},
            )
        holder = row["attached_machine"]
        if holder not in (None, machine_id):
            raise VolumeAttached(
                f"volume {volume_id} is mounted by machine {holder}: one machine at a time",
                {"volume": volume_id, "machine": holder},
            )
        if holder is None:
            volume_queries.set_volume_columns(tx, volume_id, {"attached_machine": machine_id})
            tx.log("volume", volume_id, "attach", "machine", None, data={"machine": machine_id})


def release(tx: Tx, machine_id: str) -> None:
    """The machine is destroyed: its volumes are free for the next one."""
    for volume_id in volume_queries.volumes_attached_to(tx, machine_id):
        volume_queries.set_volume_columns(tx, volume_id, {"attached_machine": None})
        tx.log("volume", volume_id, "detach", "machine", None, data={"machine": machine_id})


def mount_dirs(db: Db, settings: WorkerSettings, config: MachineConfig) -> list[tuple[str, Path]]:
    """(path in the machine, directory on the host) of each mount; the volume must be mounted."""
    found = []
    for mount in config.mounts:
        row = volume_queries.existing_volume(db, mount.volume)
        p = volume_disk.paths(settings.data_dir, row["id"])
        if not volume_disk.is_mounted(p.mountpoint):
            raise RuntimeError(f"volume {row['id']} is not mounted (it is {row['state']})")
        found.append((mount.path, p.mountpoint))
    return found


# --- reading ------------------------------------------------------------------------------------


def volume_from_row(row: Any, settings: WorkerSettings) -> Volume:
    u = volume_disk.usage(volume_disk.paths(settings.data_dir, row["id"]))
    sizes: dict[str, int] = {}
    if u is not None:
        sizes = {
            "block_size": u.block_size,
            "blocks": u.blocks,
            "blocks_free": u.blocks_free,
            "blocks_avail": u.blocks_avail,
            "bytes_total": u.blocks * u.block_size,
            "bytes_used": (u.blocks - u.blocks_free) * u.block_size,
        }
    return Volume(
        id=row["id"],
        name=row["name"],
        app=row["app"],
        state=row["state"],
        region=settings.region,
        zone=settings.name,
        size_gb=size_gb_of(row["size_mb"]),
        size_mb=row["size_mb"],
        snapshot_retention=row["snapshot_retention"],
        attached_machine_id=row["attached_machine"],
        created_at=row["created_at"],
        **sizes,
    )


def snapshot_from_row(row: Any) -> VolumeSnapshot:
    return VolumeSnapshot(
        id=row["id"],
        size=row["size"],
        volume_size=row["volume_size"],
        created_at=row["created_at"],
    )

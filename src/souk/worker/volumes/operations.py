"""Volumes on this worker: accepting their operations, and running them step by step.

The same discipline as machines: a request is decided and recorded in one transaction (the disk
is reserved against `--disk-mb` there, so two creates never both take the last of it), queued,
then run a step at a time from `fsm.VOLUME_OPERATIONS`, each step logged as it completes. After a
crash every queued operation resumes at its first unlogged step; the steps (volume_disk.py) find
what a half-done run left, so none leaks a loop device, a mount or a file.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
from souk.worker.errors import Conflict, Cordoned, InvalidState, NoRoom, NotFound, WorkerError
from souk.worker.ops.fsm import (
    VOLUME_OPERATIONS,
    VOLUME_STEP_NAMES,
    VolumeOperation,
    check_volume_transition,
)
from souk.worker.ops.tasks import MachineTasks
from souk.worker.settings import WorkerSettings
from souk.worker.state import queries, volume_queries
from souk.worker.state.queries import Db
from souk.worker.state.storage import patiently
from souk.worker.state.store import Store, Tx, now_iso
from souk.worker.volumes import disk as volume_disk

log = logging.getLogger("souk.worker.volumes")
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


def _enqueue(tx: Tx, volume_id: str, op: VolumeOperation, params: dict[str, Any]) -> int:
    op_id = volume_queries.insert_volume_operation(tx, volume_id, op.name, params)
    tx.log("volume", volume_id, op.name, "accepted", None, op_id, params)
    return op_id


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
    volume_queries.set_volume_columns(tx, volume_id, {"projected": "destroyed"})
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


# --- running operations -------------------------------------------------------------------------


@dataclass(frozen=True)
class VolumeRun:
    volume_id: str
    op_id: int
    op: VolumeOperation
    index: int
    params: dict[str, Any]


StepFn = Callable[["VolumeRunner", VolumeRun], Awaitable[None]]
STEPS: dict[str, StepFn] = {}


def _step(name: str) -> Callable[[StepFn], StepFn]:
    def register(fn: StepFn) -> StepFn:
        if name not in VOLUME_STEP_NAMES or name in STEPS:
            raise LookupError(f"volume step {name!r}: not declared, or implemented twice")
        STEPS[name] = fn
        return fn

    return register


class VolumeRunner:
    """One task per volume with queued operations; `idle` wakes whoever waits for one to end."""

    def __init__(self, store: Store, settings: WorkerSettings) -> None:
        self.store = store
        self.settings = settings
        self.tasks = MachineTasks()
        self._idle: dict[str, asyncio.Event] = {}

    def paths(self, volume_id: str) -> volume_disk.VolumePaths:
        return volume_disk.paths(self.settings.data_dir, volume_id)

    async def recover(self) -> None:
        """After a (re)start: mount every volume that should be, thaw any a crash left frozen,
        resume every queued operation."""
        if self.settings.disk_mb is not None and volume_disk.unsupported_reason() is None:
            try:
                await asyncio.to_thread(volume_disk.share_volumes, self.settings.data_dir)
            except volume_disk.DiskError as exc:
                log.warning("the volumes' directory is not a shared mount: %s", exc)
        for volume_id in volume_queries.live_volume_ids(
            self.store.read
        ):  # made, not on their way out
            try:
                await _disk(volume_disk.mount, self.paths(volume_id))
                await _disk(volume_disk.thaw, self.paths(volume_id))
            except (OSError, volume_disk.DiskError) as exc:
                log.error("volume %s could not be mounted: %s", volume_id, exc)
        for volume_id in volume_queries.volumes_with_pending(self.store.read):
            self.kick(volume_id)

    def kick(self, volume_id: str) -> None:
        self._idle.setdefault(volume_id, asyncio.Event()).clear()
        self.tasks.ensure(volume_id, lambda: self._run_queue(volume_id))

    async def settled(self, volume_id: str, timeout: float) -> bool:
        """Wait until nothing is queued for the volume (or the timeout)."""
        if not volume_queries.volume_has_pending(self.store.read, volume_id):
            return True
        event = self._idle.setdefault(volume_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _run_queue(self, volume_id: str) -> None:
        try:
            while (
                row := volume_queries.next_volume_operation(self.store.read, volume_id)
            ) is not None:
                op = VOLUME_OPERATIONS[row["op"]]
                params = json.loads(row["params"])
                index = row["next_step"]
                try:
                    while index < len(op.steps):
                        run = VolumeRun(volume_id, row["id"], op, index, params)
                        await STEPS[op.steps[index].name](self, run)
                        await self._advance(run)
                        index += 1
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if self.store.watch.fault_from(exc) is not None:
                        await self.store.watch.pause(0)
                        continue  # not logged: the step runs again
                    log.exception("volume %s: %s failed", volume_id, op.name)
                    failed = functools.partial(self._fail, run, str(exc))
                    await patiently(self.store.watch, failed)
        finally:
            self._idle.setdefault(volume_id, asyncio.Event()).set()

    async def _advance(self, run: VolumeRun, **columns: Any) -> None:
        step = run.op.steps[run.index]
        last = run.index == len(run.op.steps) - 1

        def commit(tx: Tx) -> None:
            row = volume_queries.volume(tx, run.volume_id)
            if row is None:
                raise NotFound(f"no volume {run.volume_id}")
            state = step.enters or row["state"]
            check_volume_transition(row["state"], state)
            changes: dict[str, Any] = {"state": state, "updated_at": now_iso(), **columns}
            volume_queries.set_volume_columns(tx, run.volume_id, changes)
            volume_queries.set_volume_progress(tx, run.op_id, run.index + 1, last)
            if last and volume_queries.next_volume_operation(tx, run.volume_id) is None:
                volume_queries.set_volume_columns(tx, run.volume_id, {"projected": state})
            tx.log("volume", run.volume_id, run.op.name, step.name, state, run.op_id)

        await self.store.write(commit)

    async def _fail(self, run: VolumeRun, error: str) -> None:
        def commit(tx: Tx) -> None:
            volume_queries.set_volume_progress(tx, run.op_id, run.index, True)
            row = volume_queries.volume(tx, run.volume_id)
            state = None if row is None else row["state"]
            if row is not None and run.op.name == "extend":  # the growth did not happen
                have = self.paths(run.volume_id).image
                size = have.stat().st_size >> 20 if have.exists() else row["size_mb"]
                state = "created" if state == "extending" else state  # as it was: usable
                changes = {"size_mb": min(size, row["size_mb"]), "state": state}
                volume_queries.set_volume_columns(tx, run.volume_id, changes)
            if row is not None and volume_queries.next_volume_operation(tx, run.volume_id) is None:
                volume_queries.set_volume_columns(tx, run.volume_id, {"projected": state})
            data = {"error": error}
            tx.log("volume", run.volume_id, run.op.name, "error", state, run.op_id, data)

        await self.store.write(commit)


def _disk(fn: Callable[..., Any], p: volume_disk.VolumePaths, *args: Any) -> Awaitable[Any]:
    """`fn(p, *args)` in a thread, holding the volume's lock (volume_disk.exclusive)."""
    return asyncio.to_thread(volume_disk.holding, fn, p, *args)


@_step("make_disk")
async def _make_disk(r: VolumeRunner, run: VolumeRun) -> None:
    await _disk(volume_disk.make_disk, r.paths(run.volume_id), int(run.params["size_mb"]))


@_step("copy_snapshot")
async def _copy_snapshot(r: VolumeRunner, run: VolumeRun) -> None:
    source = r.paths(str(run.params["source"])).snapshot(str(run.params["snapshot"]))
    p = r.paths(run.volume_id)
    await _disk(volume_disk.copy_snapshot, p, source)
    if p.image.stat().st_size < int(run.params["size_mb"]) << 20:  # restored into a bigger one
        await _disk(volume_disk.grow, p, int(run.params["size_mb"]))


@_step("attach_loop")
async def _attach_loop(r: VolumeRunner, run: VolumeRun) -> None:
    await _disk(volume_disk.attach, r.paths(run.volume_id))


@_step("mount_fs")
async def _mount_fs(r: VolumeRunner, run: VolumeRun) -> None:
    p = r.paths(run.volume_id)
    await _disk(volume_disk.mount, p)
    if p.image.stat().st_size < int(run.params["size_mb"]) << 20:
        await _disk(volume_disk.grow, p, int(run.params["size_mb"]))


@_step("grow_file")
async def _grow_file(r: VolumeRunner, run: VolumeRun) -> None:
    p = r.paths(run.volume_id)
    await _disk(volume_disk.grow_file, p, int(run.params["size_mb"]))


@_step("grow_fs")
async def _grow_fs(r: VolumeRunner, run: VolumeRun) -> None:
    await _disk(volume_disk.mount, r.paths(run.volume_id))
    await _disk(volume_disk.grow_fs, r.paths(run.volume_id))


@_step("copy_frozen")
async def _copy_frozen(r: VolumeRunner, run: VolumeRun) -> None:
    snapshot_id = str(run.params["snapshot"])
    p = r.paths(run.volume_id)
    size = await _disk(volume_disk.snapshot, p, snapshot_id)
    volume_size = p.image.stat().st_size

    def record(tx: Tx) -> None:
        volume_queries.insert_snapshot(tx, snapshot_id, run.volume_id, size, volume_size, now_iso())

    await r.store.write(record)  # before the step is logged: a rerun inserts nothing twice


@_step("prune_snapshots")
async def _prune(r: VolumeRunner, run: VolumeRun) -> None:
    """Keep the newest `snapshot_retention`: the rows go first, then the files, so a crash
    between the two leaves a file no row names, which the rerun removes."""
    row = volume_queries.existing_volume(r.store.read, run.volume_id)
    keep = int(row["snapshot_retention"])
    rows = volume_queries.snapshots(r.store.read, run.volume_id)
    old = [s["id"] for s in rows[: max(0, len(rows) - keep)]]
    if old:

        def forget(tx: Tx) -> None:
            for snapshot_id in old:
                volume_queries.delete_snapshot(tx, snapshot_id)

        await r.store.write(forget)
    p = r.paths(run.volume_id)
    named = {s["id"] for s in volume_queries.snapshots(r.store.read, run.volume_id)}

    def remove_unnamed() -> None:
        volume_disk.clear_temporary(p.snapshots)
        if p.snapshots.is_dir():
            for f in p.snapshots.glob("*.img"):
                if f.stem not in named:
                    f.unlink(missing_ok=True)

    await asyncio.to_thread(remove_unnamed)


@_step("begin_release")
async def _begin_release(r: VolumeRunner, run: VolumeRun) -> None:
    return None


@_step("unmount_fs")
async def _unmount(r: VolumeRunner, run: VolumeRun) -> None:
    await _disk(volume_disk.unmount, r.paths(run.volume_id))


@_step("detach_loop")
async def _detach(r: VolumeRunner, run: VolumeRun) -> None:
    await _disk(volume_disk.detach, r.paths(run.volume_id))


@_step("remove_disk")
async def _remove(r: VolumeRunner, run: VolumeRun) -> None:
    await _disk(volume_disk.remove, r.paths(run.volume_id))


@_step("release_disk")
async def _release(r: VolumeRunner, run: VolumeRun) -> None:
    """The disk is given back (and the snapshots, which lived in it, forgotten) with the step's
    log entry's transaction's neighbour: `reserved` drops before the state says destroyed."""

    def commit(tx: Tx) -> None:
        volume_queries.set_volume_columns(
            tx, run.volume_id, {"reserved": 0, "attached_machine": None}
        )
        volume_queries.delete_snapshots(tx, run.volume_id)
        tx.log("volume", run.volume_id, "destroy", "release", None, run.op_id)

    await r.store.write(commit)


missing = VOLUME_STEP_NAMES - STEPS.keys()
if missing:
    raise LookupError(f"volume steps declared without an implementation: {sorted(missing)}")

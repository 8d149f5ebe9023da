"""What each step of a volume's operations (fsm.py's `VOLUME_OPERATIONS`) does, one function per
step name, run by the same runner as a machine's (`ops/runner.py`).

Each step does its work on the disk (disk.py: loop devices, ext4, the volume's files), then logs
itself complete (`progress.advance`). After a crash every queued operation resumes at its first
unlogged step, and the steps find what a half-done run left, so none leaks a loop device, a
mount or a file. Every declared name has one implementation here: checked at import.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from souk.worker.ops.fsm import VOLUME
from souk.worker.ops.progress import StepRun, advance
from souk.worker.ops.steps import StepFn, StepTable
from souk.worker.settings import WorkerSettings
from souk.worker.state import volume_queries
from souk.worker.state.store import Store, Tx, now_iso
from souk.worker.volumes import disk as volume_disk

log = logging.getLogger("souk.worker.volumes")


@dataclass(frozen=True)
class VolumeHost:
    """What volume steps use of the worker that runs them."""

    store: Store
    settings: WorkerSettings

    def paths(self, volume_id: str) -> volume_disk.VolumePaths:
        return volume_disk.paths(self.settings.data_dir, volume_id)


STEPS: StepTable[VolumeHost] = StepTable(VOLUME.step_names)


async def remount(host: VolumeHost) -> None:
    """After a (re)start, before any queue runs: mount every volume that should be (made, not on
    its way out), thaw any a crash left frozen."""
    if host.settings.disk_mb is not None and volume_disk.unsupported_reason() is None:
        try:
            await asyncio.to_thread(volume_disk.share_volumes, host.settings.data_dir)
        except volume_disk.DiskError as exc:
            log.warning("the volumes' directory is not a shared mount: %s", exc)
    for volume_id in volume_queries.live_volume_ids(host.store.read):
        try:
            await _disk(volume_disk.mount, host.paths(volume_id))
            await _disk(volume_disk.thaw, host.paths(volume_id))
        except (OSError, volume_disk.DiskError) as exc:
            log.error("volume %s could not be mounted: %s", volume_id, exc)


def _disk(fn: Callable[..., Any], p: volume_disk.VolumePaths, *args: Any) -> Awaitable[Any]:
    """`fn(p, *args)` in a thread, holding the volume's lock (volume_disk.exclusive)."""
    return asyncio.to_thread(volume_disk.holding, fn, p, *args)


@STEPS.implements("copy_snapshot")
async def _copy_snapshot(h: VolumeHost, run: StepRun) -> int:
    source = h.paths(str(run.params["source"])).snapshot(str(run.params["snapshot"]))
    p = h.paths(run.resource)
    await _disk(volume_disk.copy_snapshot, p, source)
    if p.image.stat().st_size < int(run.params["size_mb"]) << 20:  # restored into a bigger one
        await _disk(volume_disk.grow, p, int(run.params["size_mb"]))
    return await advance(h.store, run)


@STEPS.implements("mount_fs")
async def _mount_fs(h: VolumeHost, run: StepRun) -> int:
    p = h.paths(run.resource)
    await _disk(volume_disk.mount, p)
    if p.image.stat().st_size < int(run.params["size_mb"]) << 20:
        await _disk(volume_disk.grow, p, int(run.params["size_mb"]))
    return await advance(h.store, run)


@STEPS.implements("grow_fs")
async def _grow_fs(h: VolumeHost, run: StepRun) -> int:
    await _disk(volume_disk.mount, h.paths(run.resource))
    await _disk(volume_disk.grow_fs, h.paths(run.resource))
    return await advance(h.store, run)


@STEPS.implements("copy_frozen")
async def _copy_frozen(h: VolumeHost, run: StepRun) -> int:
    snapshot_id = str(run.params["snapshot"])
    p = h.paths(run.resource)
    size = await _disk(volume_disk.snapshot, p, snapshot_id)
    volume_size = p.image.stat().st_size

    def record(tx: Tx) -> None:
        volume_queries.insert_snapshot(tx, snapshot_id, run.resource, size, volume_size, now_iso())

    await h.store.write(record)  # before the step is logged: a rerun inserts nothing twice
    return await advance(h.store, run)


@STEPS.implements("prune_snapshots")
async def _prune(h: VolumeHost, run: StepRun) -> int:
    """Keep the newest `snapshot_retention`: the rows go first, then the files, so a crash
    between the two leaves a file no row names, which the rerun removes."""
    row = volume_queries.existing_volume(h.store.read, run.resource)
    keep = int(row["snapshot_retention"])
    rows = volume_queries.snapshots(h.store.read, run.resource)
    old = [s["id"] for s in rows[: max(0, len(rows) - keep)]]
    if old:

        def forget(tx: Tx) -> None:
            for snapshot_id in old:
                volume_queries.delete_snapshot(tx, snapshot_id)

        await h.store.write(forget)
    p = h.paths(run.resource)
    named = {s["id"] for s in volume_queries.snapshots(h.store.read, run.resource)}

    def remove_unnamed() -> None:
        volume_disk.clear_temporary(p.snapshots)
        if p.snapshots.is_dir():
            for f in p.snapshots.glob("*.img"):
                if f.stem not in named:
                    f.unlink(missing_ok=True)

    await asyncio.to_thread(remove_unnamed)
    return await advance(h.store, run)


@STEPS.implements("release_disk")
async def _release(h: VolumeHost, run: StepRun) -> int:
    """The disk is given back (and the snapshots, which lived in it, forgotten) in a commit of
    its own before the step's: `reserved` drops before the state says destroyed."""

    def commit(tx: Tx) -> None:
        changes = {"reserved": 0, "attached_machine": None}
        volume_queries.set_volume_columns(tx, run.resource, changes)
        volume_queries.delete_snapshots(tx, run.resource)
        tx.log("volume", run.resource, "destroy", "release", None, run.op_id)

    await h.store.write(commit)
    return await advance(h.store, run)


def _one_call(fn: Callable[..., object] | None, sized: bool = False) -> StepFn[VolumeHost]:
    """A step that is `fn` on the volume's paths (`sized`: and the size the operation asks
    for, in MB); None: nothing but its log entry."""

    async def step(h: VolumeHost, run: StepRun) -> int:
        if fn is not None:
            size = (int(run.params["size_mb"]),) if sized else ()
            await _disk(fn, h.paths(run.resource), *size)
        return await advance(h.store, run)

    return step


for _name, _fn, _sized in (
    ("make_disk", volume_disk.make_disk, True),
    ("attach_loop", volume_disk.attach, False),
    ("grow_file", volume_disk.grow_file, True),
    ("begin_release", None, False),
    ("unmount_fs", volume_disk.unmount, False),
    ("detach_loop", volume_disk.detach, False),
    ("remove_disk", volume_disk.remove, False),
):
    STEPS.implements(_name)(_one_call(_fn, _sized))

STEPS.check_complete()

"""What each step of a machine's operations (fsm.py) does, one function per step name.

A step does its work (through a driver), then logs itself complete with `progress.advance`,
which also enters the state fsm.py gives it; it returns the index of the next step to run. A
step may run twice (a crash between its work and its log entry), so each must be idempotent.
Every name fsm.py declares has exactly one implementation here, and every implementation a
declared name: checked when this module is imported (`ops/steps.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import time
from dataclasses import replace
from typing import Protocol

from souk.models.machine import MachineConfig, StopConfig, normalize_signal
from souk.sealing import Sealer
from souk.worker.drivers.base import Drivers, Launch
from souk.worker.machines import app_users
from souk.worker.machines import secrets as machine_secrets
from souk.worker.machines.admission import reserve
from souk.worker.machines.image_sync import sync_images
from souk.worker.machines.supervision import Supervisor
from souk.worker.ops.fsm import OPERATIONS, STEP_NAMES
from souk.worker.ops.progress import StepRun, Superseded, advance, skip
from souk.worker.ops.steps import StepTable
from souk.worker.settings import WorkerSettings
from souk.worker.state import queries
from souk.worker.state.operations import MACHINE_QUEUE
from souk.worker.state.store import Store, Tx, now_iso
from souk.worker.threads import to_its_end
from souk.worker.volumes import disk as volume_disk
from souk.worker.volumes import operations as volumes

_STOP_STEPS = OPERATIONS["stop"].steps
KILL_RETRY_MAX = 1.0  # between SIGKILLs to a machine's process that is not gone yet

log = logging.getLogger("souk.worker")


class StepHost(Protocol):
    """What steps use of the worker that runs them."""

    store: Store
    settings: WorkerSettings
    drivers: Drivers
    supervisor: Supervisor
    marked_here: set[str]  # spawn markers no earlier worker run can have used
    sealer: Sealer  # opens the secrets the machine runs with
    pending_at_boot: set[int]  # operations queued before this worker run began


STEPS: StepTable[StepHost] = StepTable(STEP_NAMES)


def spawn_marker(machine_id: str, op_id: int) -> str:
    """Unique per start operation: how a restarted worker tells that start's process apart."""
    return f"{machine_id}.{op_id}"


def _launch(w: StepHost, run: StepRun, secrets: bool = False) -> Launch:
    """The machine as a driver sees it; with `secrets` (a spawn only: stopping and cleaning up
    need none), the app's secrets opened into its env and for its files."""
    row = queries.existing_machine(w.store.read, run.resource)
    marker = row["marker"] or spawn_marker(run.resource, run.op_id)
    opened = {}
    if secrets:
        opened = machine_secrets.opened(w.store.read, w.sealer, row["app"], run.resource)
    config = MachineConfig.model_validate_json(row["config"])
    return Launch(
        machine_id=run.resource,
        app=row["app"],
        region=w.settings.region,
        instance_id=row["instance_id"],
        config=machine_secrets.with_env(config, opened),
        marker=marker,
        rundir=w.settings.rundir(run.resource),
        private_ip=row["private_ip"] or "127.0.0.1",
        resumed=marker not in w.marked_here,
        home=app_users.home(w.settings.data_dir, row["app"], run.resource),
        secrets=opened,
    )


def _with_volumes(w: StepHost, launch: Launch) -> Launch:
    """The launch with its mounts' host directories, each owned by the machine's user (a
    container's root maps to it), so what runs there may write to its volume."""
    mounts = volumes.mount_dirs(w.store.read, w.settings, launch.config)
    if launch.user is not None:
        for _, directory in mounts:
            volume_disk.give_to(
                volume_disk.VolumePaths(directory.parent), launch.user.uid, launch.user.gid
            )
    return dataclasses.replace(launch, volumes=tuple(mounts))


def _stop_config(w: StepHost, run: StepRun) -> StopConfig:
    return _launch(w, run).config.stop_config


@STEPS.implements("begin_start")
async def _begin_start(w: StepHost, run: StepRun) -> int:
    """Logged with the spawn (one commit less on the way to a running process) when this
    worker run accepted the operation: no process with its marker can exist yet. An operation
    queued before a restart may have spawned one: this step is then logged first, and the spawn
    looks for that process."""
    while (delay := float(run.params.get("not_before", 0)) - time.time()) > 0:
        if MACHINE_QUEUE.queued_after(w.store.read, run.resource, run.op_id):
            # a restart backing off yields to what came next
            return await skip(w.store, run, len(run.op.steps), "superseded")
        await asyncio.sleep(min(delay, 0.1))
    marker = spawn_marker(run.resource, run.op_id)
    if run.op_id in w.pending_at_boot:  # an earlier run may have spawned with this marker
        return await advance(w.store, run, marker=marker)
    w.marked_here.add(marker)
    if run.step.with_next and _starts_at_once(w, run):
        return run.index + 1
    return await advance(w.store, run, marker=marker)


def _starts_at_once(w: StepHost, run: StepRun) -> bool:
    """No image to pull before the spawn: `begin_start` may then wait for the spawn's commit;
    a start that pulls is `starting` while it does."""
    image = json.loads(queries.existing_machine(w.store.read, run.resource)["config"])
    image = image.get("image") if isinstance(image, dict) else None
    return not image or w.drivers.image_cached(image)


@STEPS.implements("spawn")
async def _spawn(w: StepHost, run: StepRun) -> int:
    logged = MACHINE_QUEUE.progress(w.store.read, run.op_id)
    launch = _launch(w, run, secrets=True)
    if logged < run.index:  # begin_start is to be logged with this step: its marker is new
        launch = replace(launch, marker=spawn_marker(run.resource, run.op_id))
    launch = await app_users.assign(w.store, w.settings.data_dir, launch)
    launch = _with_volumes(w, launch)
    w.marked_here.discard(launch.marker)
    kind = Drivers.kind_of(launch.config)
    driver = w.drivers.require(kind)
    if kind == "image":  # a version runs the image its first start found: no lookup after it
        pinned = queries.image_pin(w.store.read, run.resource, launch.instance_id)
        launch = replace(launch, image_digest=pinned)
    digest = await driver.prepare(launch)
    if kind == "image":  # prepared means pulled: the cache (and the catalog) has it now
        await sync_images(w.store, w.drivers.images)
    # Returns once the process is the command, as the app, within its limits: `started` is
    # visible the moment it commits. Run to its end even if a forced destroy cancels this step:
    # a spawn cut short could leave a process that begins to run after the destroy looked.
    handle = await to_its_end(driver.spawn(launch))

    def pin(tx: Tx) -> None:
        if digest is not None and digest != launch.image_digest:
            queries.pin_image(tx, run.resource, launch.instance_id, digest)

    following = await advance(
        w.store,
        run,
        {"pid": handle.pid, "driver": kind, **({"image": digest} if digest else {})},
        after=min(logged, run.index),
        also=pin,
        marker=launch.marker,
        pid=handle.pid,
        pid_start=handle.pid_start,
        driver=kind,
        exit_code=None,
    )
    w.supervisor.monitor(run.resource)
    return following


@STEPS.implements("begin_stop")
async def _begin_stop(w: StepHost, run: StepRun) -> int:
    """A suspended machine is killed where it is frozen, as Fly discards a suspended machine's
    snapshot on a stop: it is never thawed to run on, and its next start is a fresh one."""
    m = run.resource
    state = queries.state_of(w.store.read, m)
    if state not in ("started", "starting", "suspended"):
        # it exited meanwhile: nothing to stop
        return await skip(w.store, run, run.index + len(_STOP_STEPS), "not running")
    if state == "suspended":
        await w.supervisor.running_driver(m).stop(m, w.supervisor.handle(m), "SIGKILL", 0)
    return await advance(w.store, run)


def _signal_named(run: StepRun, name: str) -> str:
    """The signal as the drivers send it. Older workers queued stops with names such as "TERM"
    or "15"; an operation already in the log must still run, so what cannot be read is SIGTERM."""
    try:
        return normalize_signal(name)
    except ValueError:
        log.warning("%s: unknown signal %r; SIGTERM instead", run.resource, name)
        return "SIGTERM"


@STEPS.implements("signal")
async def _signal(w: StepHost, run: StepRun) -> int:
    m, config = run.resource, _stop_config(w, run)
    signal = _signal_named(run, str(run.params.get("signal") or config.signal))
    timeout = run.params.get("timeout")
    await w.supervisor.running_driver(m).stop(
        m, w.supervisor.handle(m), signal, config.timeout if timeout is None else timeout
    )
    return await advance(w.store, run, {"signal": signal})


@STEPS.implements("end_stop")
async def _end_stop(w: StepHost, run: StepRun) -> int:
    return await advance(w.store, run, pid=None)


@STEPS.implements("freeze")
async def _freeze(w: StepHost, run: StepRun) -> int:
    """Suspend: the machine's processes stop where they are, memory and all; its reservation
    is kept, so a resume can never find the room taken."""
    m = run.resource
    await w.supervisor.running_driver(m).freeze(m, w.supervisor.handle(m))
    return await advance(w.store, run)


@STEPS.implements("thaw")
async def _thaw(w: StepHost, run: StepRun) -> int:
    m = run.resource
    await w.supervisor.running_driver(m).thaw(m, w.supervisor.handle(m))
    return await advance(w.store, run)


@STEPS.implements("apply_config")
async def _apply_config(w: StepHost, run: StepRun) -> int:
    """The config was recorded when the update was accepted; this step marks where the
    machine, stopped, takes it on."""
    return await advance(w.store, run, {"instance_id": run.params.get("instance_id")})


@STEPS.implements("begin_destroy")
async def _begin_destroy(w: StepHost, run: StepRun) -> int:
    return await advance(w.store, run)


@STEPS.implements("kill")
async def _kill(w: StepHost, run: StepRun) -> int:
    """Stop whatever runs, and see that it is gone: the reservation is released after this step,
    and must never be while any process of the machine lives."""
    m, config = run.resource, _stop_config(w, run)
    driver, handle = w.supervisor.running_driver(m), w.supervisor.handle(m)
    if run.params.get("force"):
        await driver.stop(m, handle, "SIGKILL", 0)
    else:
        await driver.stop(m, handle, config.signal, config.timeout)
    delay = 0.01
    while left := await driver.remaining(m, handle):
        log.warning("destroy of %s: processes %s still run; SIGKILL again", m, left)
        await driver.stop(m, handle, "SIGKILL", 0)
        await asyncio.sleep(delay)
        delay = min(delay * 2, KILL_RETRY_MAX)
    return await advance(w.store, run, pid=None)


@STEPS.implements("cleanup")
async def _cleanup(w: StepHost, run: StepRun) -> int:
    launch = _launch(w, run)
    # A start that failed in `prepare` ran no process, but may have made things (an image
    # machine's network, its root filesystem): its config's driver cleans those up.
    ran = queries.driver_of(w.store.read, run.resource)
    await w.drivers.require(ran or Drivers.kind_of(launch.config)).cleanup(launch)
    if launch.rundir.exists():
        await asyncio.to_thread(shutil.rmtree, launch.rundir, True)
    return await advance(w.store, run)


@STEPS.implements("end_destroy")
async def _end_destroy(w: StepHost, run: StepRun) -> int:
    """Release the reservation and end whatever else was queued: the machine is gone."""
    m, settings = run.resource, w.settings

    def commit(tx: Tx) -> None:
        if MACHINE_QUEUE.done(tx, run.op_id):  # a forced destroy took over: it releases
            raise Superseded(f"destroy of {m} was superseded")
        row = queries.existing_machine(tx, m)
        if row["reserved"]:
            reserve(tx, settings, -row["cpus"], -row["memory_mb"], -1, f"release {m}")
        queries.set_destroyed(tx, m, now_iso())
        queries.set_machine_secrets(tx, m, None)
        queries.unpin_images(tx, m)
        volumes.release(tx, m)
        MACHINE_QUEUE.finish_all(tx, m, run.index + 1)
        tx.log("machine", m, run.op.name, run.step.name, "destroyed", run.op_id)

    await w.store.write(commit)
    w.supervisor.monitors.forget(m)
    return len(run.op.steps)


STEPS.check_complete()

"""The worker's engine: the one object the API and the catalog talk to, coordinating the parts.

An operation is accepted in one transaction that checks it against the machine's *projected*
state and queues it (`machines/admission`); the one runner, a task per machine (and another
runner, a task per volume), then executes the queued operations one at a time (`runner`, with
each kind's steps), committing every step to the log as it completes (`progress`); monitors
notice exits and apply the restart policy (`machines/supervision`). After a crash, `recover()`
adopts the processes that survived and resumes each queued operation at its first unlogged step.
Domain refusals are `errors.WorkerError`s; only `http/` turns them into HTTP answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from souk.models.api import Lease
from souk.models.capacity import Capacity, Offer, OfferRequest
from souk.models.machine import (
    CreateMachine,
    Machine,
    MachineConfig,
    MachineEvent,
    MachineState,
    MetadataChange,
)
from souk.models.machine_ops import ExecRequest, ExecResponse, MachineVersion, ProcessStat
from souk.models.volume import CreateVolume, UpdateVolumeRequest, Volume, VolumeSnapshot
from souk.sealing import Sealer, worker_key
from souk.worker.drivers.base import Driver, Drivers, ExecTimeout, Handle, Launch
from souk.worker.errors import InvalidState, NotFound, StorageFault, TimedOut
from souk.worker.host.cgroups import Cgroups, worker_group
from souk.worker.host.identity import HostUser
from souk.worker.machines import admission, app_users, holds, leases, ps
from souk.worker.machines import secrets as machine_secrets
from souk.worker.machines import steps as machine_steps
from souk.worker.machines.check_following import CheckFollowing
from souk.worker.machines.checks import HealthChecks
from souk.worker.machines.operations import MACHINES
from souk.worker.machines.supervision import Supervisor
from souk.worker.metrics import WorkerMetrics
from souk.worker.ops.fsm import OPERATIONS
from souk.worker.ops.runner import Runner
from souk.worker.settings import WorkerSettings
from souk.worker.state import queries, volume_queries
from souk.worker.state.operations import MACHINE_QUEUE, operation_error
from souk.worker.state.storage import free_bytes
from souk.worker.state.store import Commit, Store, Tx
from souk.worker.status import BusLink, StorageStatus, WorkerStatus, bus_status
from souk.worker.volumes import disk as volume_disk
from souk.worker.volumes import operations as volume_ops
from souk.worker.volumes import steps as volume_steps
from souk.worker.volumes.operations import VOLUMES
from souk.worker.volumes.steps import VolumeHost

VOLUME_WAIT = 60.0  # how long a volume request waits for its operation before answering

FLY_EVENT_TYPES = {"create": "launch"}


def fly_event(row: Any) -> MachineEvent:
    """An operation log entry as Fly shows a machine event: string id, Fly's type (`launch`,
    `start`, `exit`...), and for an exit Fly's `exit_event`; souk's step and data stay."""
    data = json.loads(row["data"])
    kind = FLY_EVENT_TYPES.get(row["op"], row["op"])
    if row["op"] == "event":  # not an operation: what happened (an exit, an adoption)
        kind = row["step"]
    if kind == "exit" and isinstance(data, dict):
        exit_event: dict[str, Any] = {
            "requested_stop": "restart" not in data,
            "restarting": bool(data.get("restart")),
            "oom_killed": False,
            "exited_at": datetime.fromtimestamp(row["ts"], UTC).isoformat().replace("+00:00", "Z"),
        }
        if isinstance(data.get("exit_code"), int):
            exit_event["exit_code"] = exit_event["guest_exit_code"] = data["exit_code"]
        data = {**data, "exit_event": exit_event}
    return MachineEvent(
        id=str(row["seq"]),
        type=kind,
        status=row["state"] or "",
        timestamp=int(row["ts"] * 1000),
        request=data if isinstance(data, dict) else {},
        step=row["step"],
    )


log = logging.getLogger("souk.worker")


class Engine:
    def __init__(self, settings: WorkerSettings, drivers: Drivers) -> None:
        self.settings = settings
        self.drivers = drivers
        settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # a root one: 0711
        self.store = Store(settings.db_path, durable=settings.durable)
        self.metrics = WorkerMetrics(
            {name: [s.name for s in op.steps] for name, op in OPERATIONS.items()}, settings.metrics
        )
        self.store.on_batch = self.metrics.batch if settings.metrics else None
        self.marked_here: set[str] = set()  # spawn markers no earlier worker run can have used
        self.pending_at_boot: set[int] = set()  # operations queued before this run began
        self.sealer = Sealer(worker_key(settings.data_dir))  # machines' secrets, at rest
        self.runner = Runner(self.store, MACHINES, machine_steps.STEPS, self, self.metrics)
        self.holds = holds.HoldKeeper(self.store, self.runner.preempt)
        self.volume_host = VolumeHost(self.store, settings)
        self.volumes = Runner(self.store, VOLUMES, volume_steps.STEPS, self.volume_host)
        self.volumes_refused = volume_disk.unsupported_reason()
        if settings.disk_mb is None and self.volumes_refused is None:
            self.volumes_refused = volume_ops.NO_DISK
        self.supervisor = Supervisor(self.store, drivers, self.runner.kick)
        self.supervisor.restarts = self.metrics.restarts
        self.metrics.watch(self.capacity, lambda: queries.machine_states(self.store.read))
        self.checks = HealthChecks()
        self.following = CheckFollowing(self.store, self.checks)
        self._changed: dict[str, asyncio.Event] = {}
        self.store.listeners.append(self._wake_waiters)
        self.store.listeners.append(self.following.on_commit)
        self.epoch = self._init_meta()
        self.bus_link: BusLink | None = None  # set by whoever connects it to the catalog

    # --- start-up and recovery -------------------------------------------------------------

    def _init_meta(self) -> str:
        read = self.store.read
        epoch = self.store.meta("epoch")
        if epoch is None:
            # Ordered by creation time, so a replica can tell a newer database from an older one.
            epoch = f"{time.time_ns():016x}-{secrets.token_hex(4)}"
            with self.store.read as conn:  # one-time initialisation, before any writer runs
                queries.init_meta(conn, epoch, self.settings.name)
        name = self.store.meta("name")
        if name != self.settings.name:
            raise SystemExit(f"{read} belongs to worker {name!r}, not {self.settings.name!r}")
        return self.store.meta("epoch") or epoch

    async def recover(self) -> None:
        """Log the start, adopt surviving processes, notice the ones that died meanwhile, resume
        operations. The start entry also gives even an empty worker a head to announce, so the
        catalog learns of it (its worker row) from the first heartbeat."""
        boot = {"pid": os.getpid()}
        try:
            await self.store.write(
                lambda tx: tx.log("worker", self.settings.name, "boot", "started", data=boot)
            )
        except StorageFault:  # informative only; the worker serves (and says why) all the same
            pass
        # volumes first: a machine may mount one
        await volume_steps.remount(self.volume_host)
        self.volumes.resume()
        self.pending_at_boot = MACHINE_QUEUE.pending_ids(self.store.read)
        await self.supervisor.adopt()
        self.runner.resume()
        # results are not kept across restarts
        self.following.sync(queries.started_ids(self.store.read))
        self.holds.start()  # holds whose deadline passed while the worker was down end now

    async def close(self) -> None:
        await self.holds.close()
        tasks = [
            *self.runner.tasks.cancel(),
            *self.supervisor.cancel(),
            *self.volumes.tasks.cancel(),
        ]
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.checks.close()
        await self.drivers.close()
        self.store.close()

    def kill_now(self, within: float = 1.0) -> int:
        """SIGKILL to every process in every machine's cgroups, frozen ones included, again
        until they are gone (at most `within` seconds), recording nothing (a later start of
        this worker finds them gone): for an owner that cannot wait for forced destroys
        (`souk dev` told twice to stop). Blocks; returns how many were signalled."""
        groups = Cgroups(worker_group(self.settings.name))
        ids = [row["id"] for row in queries.machines(self.store.read, None, False)]
        killed, deadline = sum(groups.kill(m) for m in ids), time.monotonic() + within
        while any(groups.pids(m) for m in ids) and time.monotonic() < deadline:
            time.sleep(0.01)
            for m in ids:
                groups.kill(m)
        return killed

    # --- accepting work ----------------------------------------------------------------------

    async def create(
        self, req: CreateMachine, hold: float | None = None, wait: float = 0.0
    ) -> Machine:
        """`hold`: seconds the machine stays provisional (see `holds`) unless confirmed.
        `wait`: with `start`, seconds the answer may wait for the machine to be started (or to
        fail starting), so that its client need not ask again. A machine that can start at
        once is then committed with its start's spawn (fsm.py's `CREATE_SYNCED_BY`): the answer
        comes once it is durable, whatever the wait."""
        machine_id = req.id or admission.new_machine_id()
        admission.check_runnable(self.drivers, self.settings, req.config)
        until = None if hold is None else time.time() + min(max(hold, 0.0), holds.MAX_HOLD)

        def accept_create(tx: Tx) -> None:
            admission.create(tx, self.settings, machine_id, req, until)
            machine_secrets.record(tx, self.sealer, req.app, machine_id, req.secrets)

        waits = req.start and wait > 0 and self._starts_at_once(req.config)
        await self.store.write(accept_create, durable=not waits)
        mark = self.store.commits  # the create's commit is one of these
        if req.start:
            self.runner.kick(machine_id)
        if until is not None:
            self.holds.poke()
        if waits:
            await self._started_or_failed(machine_id, wait)
            await self.store.synced(mark)
        return self.get(machine_id, events=False)

    def _starts_at_once(self, config: MachineConfig) -> bool:
        """No image to pull first: a start that takes about as long as a spawn."""
        return Drivers.kind_of(config) == "command" or self.drivers.image_cached(config.image)

    async def _started_or_failed(self, machine_id: str, timeout: float) -> None:
        """Until the machine is past `created` and `starting`, or `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            event = self._changed.setdefault(machine_id, asyncio.Event())
            if queries.state_of(self.store.read, machine_id) not in ("created", "starting"):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                pass

    async def confirm(self, machine_ids: list[str]) -> dict[str, str]:
        """End the holds of these machines: their creator has answered its client."""
        return await self.store.write(lambda tx: holds.confirm(tx, machine_ids))

    def provisional_until(self, machine_id: str) -> float | None:
        """The deadline of the machine's hold, or None once confirmed (or never held)."""
        return queries.hold_until(self.store.read, machine_id)

    async def submit(
        self,
        machine_id: str,
        op_name: str,
        params: dict[str, Any] | None = None,
        nonce: str | None = None,
    ) -> Machine:
        """Queue start, stop, restart, suspend or destroy; returns once the operation is durably
        accepted (a resume may have begun before: see `_resume_early`)."""
        op, params = OPERATIONS[op_name], params or {}
        thawed = await self._resume_early(machine_id, nonce) if op_name == "start" else None
        try:
            queued = await self.store.write(
                lambda tx: admission.accept(tx, machine_id, op, params, nonce)
            )
        except BaseException:
            if thawed is not None and queries.state_of(self.store.read, machine_id) == "suspended":
                await thawed.freeze(machine_id, self.supervisor.handle(machine_id))
            raise
        if queued and op_name == "destroy" and params.get("force"):
            self.runner.preempt(machine_id)  # what its queue was doing is over
        else:
            self.runner.kick(machine_id)  # also when already on its way: it must be running
        return self.get(machine_id, events=False)

    async def _resume_early(self, machine_id: str, nonce: str | None) -> Driver | None:
        """A start of a machine settled in `suspended` thaws it at once, before the resume is
        recorded (its thaw step then finds it thawed): the machine runs again without waiting
        for a commit. Should the record fail, it is frozen again; should the worker die first,
        the restarted worker freezes it again, as the log has it suspended. The driver that
        thawed it, or None when the start takes the usual path."""
        db = self.store.read
        row = queries.machine(db, machine_id)
        if row is None or (row["state"], row["projected"]) != ("suspended", "suspended"):
            return None
        if MACHINE_QUEUE.has_pending(db, machine_id):
            return None
        leases.check(db, machine_id, nonce)
        driver = self.supervisor.running_driver(machine_id)
        try:
            await driver.thaw(machine_id, self.supervisor.handle(machine_id))
        except Exception as exc:  # the resume's own step tries again, and reports it
            log.warning("early thaw of %s failed: %s", machine_id, exc)
            return None
        return driver

    async def update(
        self,
        machine_id: str,
        config: MachineConfig,
        start: bool | None = None,
        nonce: str | None = None,
        secrets: dict[str, str] | None = None,
    ) -> Machine:
        """New config and instance id, in place; refused when the new size does not fit here.

        The new config and instance id are the machine's from the moment the update is accepted
        (so the answer carries them); a running machine is then stopped and started again on it.
        """
        admission.check_runnable(self.drivers, self.settings, config)

        def accept(tx: Tx) -> None:
            admission.update(tx, self.settings, machine_id, config, start, nonce)
            app = queries.existing_machine(tx, machine_id)["app"]
            machine_secrets.record(tx, self.sealer, app, machine_id, secrets or {})

        await self.store.write(accept)
        self.runner.kick(machine_id)
        return self.get(machine_id, events=False)

    async def patch_metadata(
        self, machine_id: str, patch: MetadataChange, nonce: str | None = None
    ) -> Machine:
        """Change config.metadata in place: same instance, no restart (the proxy and the CLI
        keep their marks there)."""
        await self.store.write(lambda tx: admission.patch_metadata(tx, machine_id, patch, nonce))
        return self.get(machine_id, events=False)

    async def acquire_lease(
        self, machine_id: str, ttl: int, description: str, owner: str, nonce: str | None
    ) -> Lease:
        """A new lease, or the holder's own extended (same nonce); refused while another holds
        one."""

        def apply(tx: Tx) -> Lease:
            return leases.acquire(tx, machine_id, ttl, description, owner, nonce)

        return await self.store.write(apply)

    def lease(self, machine_id: str) -> Lease | None:
        queries.existing_machine(self.store.read, machine_id)
        return queries.lease(self.store.read, machine_id)

    async def release_lease(self, machine_id: str, nonce: str | None) -> None:
        await self.store.write(lambda tx: leases.release(tx, machine_id, nonce))

    async def set_cordoned(self, cordoned: bool) -> None:
        await self.store.write(lambda tx: admission.set_cordoned(tx, self.settings, cordoned))

    # --- acting on a running machine ---------------------------------------------------------

    def _running(self, machine_id: str, verb: str) -> tuple[Driver, Handle | None, Any]:
        """The driver and process of a started machine; a 409 for any other state (a suspended
        machine's processes are frozen: start it first)."""
        row = queries.existing_machine(self.store.read, machine_id)
        if row["state"] != "started":
            raise InvalidState(f"machine {machine_id} is {row['state']}: cannot {verb} it")
        return self.supervisor.running_driver(machine_id), self.supervisor.handle(machine_id), row

    async def signal(self, machine_id: str, signal: str, nonce: str | None = None) -> None:
        """Send a signal to the machine's main process; logged, and nothing else changes (an
        exit it causes is an exit like any other). A held lease guards it as it guards a stop."""
        driver, handle, _ = self._running(machine_id, "signal")
        leases.check(self.store.read, machine_id, nonce)
        await driver.signal(machine_id, handle, signal)
        data = {"signal": signal}
        await self.store.write(
            lambda tx: tx.log("machine", machine_id, "event", "signal", None, data=data)
        )

    async def exec(self, machine_id: str, req: ExecRequest) -> ExecResponse:
        """Run a command inside the machine as its driver runs the machine itself."""
        driver, handle, row = self._running(machine_id, "exec in")
        launch = self._launch_of(row)
        stdin = (req.stdin or "").encode()
        try:
            result = await driver.exec(launch, handle, req.argv(), stdin, float(req.timeout))
        except ExecTimeout as exc:
            raise TimedOut(str(exc), {"timeout": req.timeout}) from None
        return ExecResponse(
            stdout=result.stdout.decode(errors="replace"),
            stderr=result.stderr.decode(errors="replace"),
            exit_code=result.exit_code,
            exit_signal=result.signal,
        )

    def _launch_of(self, row: Any) -> Launch:
        """How the machine's current process was launched, for a command run beside it."""
        user = None
        if os.geteuid() == 0 and (ids := app_users.lookup(self.store.read, row["app"])):
            user = HostUser(ids[0], ids[1], app_users.SPAN)
        return Launch(
            machine_id=row["id"],
            app=row["app"],
            region=self.settings.region,
            instance_id=row["instance_id"],
            config=MachineConfig.model_validate_json(row["config"]),
            marker=row["marker"] or "",
            rundir=self.settings.rundir(row["id"]),
            private_ip=row["private_ip"] or "127.0.0.1",
            home=app_users.home(self.settings.data_dir, row["app"], row["id"]),
            user=user,
        )

    async def processes(self, machine_id: str, sort_by: str, order: str) -> list[ProcessStat]:
        """The machine's processes now (none unless it is started or suspended)."""
        return ps.table(await self.pids(machine_id), sort_by, order)

    async def pids(self, machine_id: str) -> list[int]:
        """The ids of the machine's processes now (none unless it is started or suspended)."""
        row = queries.existing_machine(self.store.read, machine_id)
        if row["state"] not in ("started", "suspended") or row["pid"] is None:
            return []
        driver, handle = (
            self.supervisor.running_driver(machine_id),
            self.supervisor.handle(machine_id),
        )
        return await driver.processes(machine_id, handle)

    def versions(self, machine_id: str) -> list[MachineVersion]:
        """Every config the machine has had, newest first. A machine created before versions
        were kept shows its current config as its one version."""
        row = queries.existing_machine(self.store.read, machine_id)
        found = [
            (r["version"], r["config"], r["created_at"])
            for r in queries.versions(self.store.read, machine_id)
        ]
        if not found:
            found = [(row["instance_id"], row["config"], row["updated_at"])]
        return [
            MachineVersion(
                version=version,
                user_config=MachineConfig.model_validate_json(config),
                created_at=created_at,
            )
            for version, config, created_at in found
        ]

    # --- reading -----------------------------------------------------------------------------

    def get(self, machine_id: str, events: bool = True) -> Machine:
        row = queries.existing_machine(self.store.read, machine_id)
        return self.machine_from_row(row, self.events(machine_id) if events else [])

    def machines(self, app: str | None = None, include_destroyed: bool = False) -> list[Machine]:
        rows = queries.machines(self.store.read, app, include_destroyed)
        return [self.machine_from_row(row, []) for row in rows]

    def events(self, machine_id: str, limit: int = 100) -> list[MachineEvent]:
        return [fly_event(r) for r in queries.events(self.store.read, machine_id, limit)]

    def offer(self, req: OfferRequest) -> Offer:
        """Would this guest fit here now? A hint for ranking; only a reservation decides. A
        worker whose data directory takes no writes cannot create anything: it offers nothing."""
        offer = admission.offer(req, self.capacity(), self.drivers)
        if self.store.watch.fault is not None:
            offer.fits = False
        return offer

    def status(self) -> WorkerStatus:
        """Whether changes can be recorded now, and whether the catalog's bus is reached."""
        watch = self.store.watch
        fault = watch.fault
        storage = StorageStatus(
            writable=fault is None,
            reason=None if fault is None else fault.reason,
            message=None if fault is None else fault.message,
            since=watch.since,
            free_bytes=free_bytes(self.settings.data_dir),
            stalled_operations=0 if fault is None else MACHINE_QUEUE.pending_count(self.store.read),
        )
        s = self.settings
        return WorkerStatus(
            worker=s.name, region=s.region, storage=storage, bus=bus_status(self.bus_link)
        )

    def capacity(self) -> Capacity:
        cap = admission.capacity(self.store.read, self.settings, self.volumes_refused)
        cap.vm = self.drivers.vm
        return cap

    # --- volumes -----------------------------------------------------------------------------

    async def _settled_volume(
        self, volume_id: str, op_id: int | None, wait: float, what: str
    ) -> Volume:
        """The volume once its queue has run (or `wait`); the operation's error, if it failed."""
        await self.volumes.settled(volume_id, wait)
        error = None if op_id is None else operation_error(self.store.read, volume_id, op_id)
        if error is not None:
            raise volume_ops.VolumeFailed(f"{what} volume {volume_id} failed: {error}")
        return self.volume(volume_id, include_destroyed=True)

    async def create_volume(self, req: CreateVolume, wait: float = VOLUME_WAIT) -> Volume:
        """Reserve the disk and queue the making of it; answers once it is made (or `wait`).
        A volume that could not be made keeps its disk until it is destroyed."""
        refused = self.volumes_refused
        op_id = await self.store.write(
            lambda tx: volume_ops.create(tx, self.settings, req, refused)
        )
        self.volumes.kick(req.id)
        return await self._settled_volume(req.id, op_id, wait, "making")

    async def extend_volume(
        self, volume_id: str, size_mb: int, wait: float = VOLUME_WAIT
    ) -> Volume:
        op_id = await self.store.write(
            lambda tx: volume_ops.extend(tx, self.settings, volume_id, size_mb)
        )
        self.volumes.kick(volume_id)
        return await self._settled_volume(volume_id, op_id, wait, "extending")

    async def snapshot_volume(self, volume_id: str, wait: float = VOLUME_WAIT) -> str:
        snapshot_id, op_id = await self.store.write(lambda tx: volume_ops.snapshot(tx, volume_id))
        self.volumes.kick(volume_id)
        await self._settled_volume(volume_id, op_id, wait, "a snapshot of")
        return snapshot_id

    async def destroy_volume(self, volume_id: str, wait: float = VOLUME_WAIT) -> Volume:
        op_id = await self.store.write(lambda tx: volume_ops.destroy(tx, volume_id))
        self.volumes.kick(volume_id)
        return await self._settled_volume(volume_id, op_id, wait, "destroying")

    async def update_volume(self, volume_id: str, req: UpdateVolumeRequest) -> Volume:
        await self.store.write(lambda tx: volume_ops.update(tx, volume_id, req))
        return self.volume(volume_id)

    def volume(self, volume_id: str, include_destroyed: bool = False) -> Volume:
        row = volume_queries.volume(self.store.read, volume_id)
        if row is None or (row["state"] == "destroyed" and not include_destroyed):
            raise NotFound(f"no volume {volume_id} on worker {self.settings.name}")
        return volume_ops.volume_from_row(row, self.settings)

    def list_volumes(self, app: str | None = None) -> list[Volume]:
        rows = volume_queries.volumes(self.store.read, app)
        return [volume_ops.volume_from_row(row, self.settings) for row in rows]

    def snapshots(self, volume_id: str) -> list[VolumeSnapshot]:
        volume_queries.existing_volume(self.store.read, volume_id)
        rows = volume_queries.snapshots(self.store.read, volume_id)
        return [volume_ops.snapshot_from_row(row) for row in rows]

    async def wait(
        self, machine_id: str, state: MachineState, timeout: float, instance_id: str | None
    ) -> tuple[bool, Machine]:
        """Long-poll until the machine is in `state` (for that instance, if given) or time-out.

        Only a settled state counts, with nothing queued that would move the machine on: after
        an update, "started" means started on the new config, not still running the old one.
        """
        deadline = time.monotonic() + timeout
        while True:
            event = self._changed.setdefault(machine_id, asyncio.Event())
            machine = self.get(machine_id, events=False)
            settled = not MACHINE_QUEUE.has_pending(self.store.read, machine_id)
            if settled and machine.state == state and instance_id in (None, machine.instance_id):
                return True, machine
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False, machine
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                pass

    def machine_from_row(self, row: Any, events: list[MachineEvent] | None = None) -> Machine:
        config = MachineConfig.model_validate_json(row["config"])
        pinned = None
        if config.image:
            pinned = queries.image_pin(self.store.read, row["id"], row["instance_id"])
        return Machine(
            id=row["id"],
            name=row["name"],
            app=row["app"],
            region=self.settings.region,
            state=row["state"],
            instance_id=row["instance_id"],
            config=config,
            worker=self.settings.name,
            private_ip=row["private_ip"],
            restart_count=row["restart_count"],
            exit_code=row["exit_code"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            events=events or [],
            checks=self.following.observed(row),
            image_digest=pinned,
        )

    def _wake_waiters(self, commit: Commit) -> None:
        for kind, key in commit.touched:
            if kind == "machine":
                event = self._changed.pop(key, None)
                if event is not None:
                    event.set()

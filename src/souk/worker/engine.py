"""The worker's engine: the one object the API and the catalog talk to, coordinating the parts.

An operation is accepted in one transaction that checks it against the machine's *projected*
state and queues it (`admission`); a runner per machine then executes the queued operations one
at a time (`runner`, `steps`), committing every step to the log as it completes (`progress`);
monitors notice exits and apply the restart policy (`supervision`). After a crash, `recover()`
adopts the processes that survived and resumes each queued operation at its first unlogged step.
Domain refusals are `errors.WorkerError`s; only `api.py` turns them into HTTP answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
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
from souk.worker import admission, holds, leases, queries
from souk.worker.check_following import CheckFollowing
from souk.worker.checks import HealthChecks
from souk.worker.drivers.base import Drivers
from souk.worker.errors import StorageFault
from souk.worker.fsm import OPERATIONS
from souk.worker.runner import Runner
from souk.worker.settings import WorkerSettings
from souk.worker.status import BusLink, StorageStatus, WorkerStatus, bus_status
from souk.worker.storage import free_bytes
from souk.worker.store import Commit, Store, Tx
from souk.worker.supervision import Supervisor


class Engine:
    def __init__(self, settings: WorkerSettings, drivers: Drivers) -> None:
        self.settings = settings
        self.drivers = drivers
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(settings.db_path, durable=settings.durable)
        self.marked_here: set[str] = set()  # spawn markers no earlier worker run can have used
        self.pending_at_boot: set[int] = set()  # operations queued before this run began
        self.runner = Runner(self.store, self)
        self.holds = holds.HoldKeeper(self.store, self.runner.kick)
        self.supervisor = Supervisor(self.store, drivers, self.runner.kick)
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
        self.pending_at_boot = queries.pending_operation_ids(self.store.read)
        await self.supervisor.adopt()
        for machine_id in queries.machines_with_pending(self.store.read):
            self.runner.kick(machine_id)
        # results are not kept across restarts
        self.following.sync(queries.started_ids(self.store.read))
        self.holds.start()  # holds whose deadline passed while the worker was down end now

    async def close(self) -> None:
        await self.holds.close()
        tasks = [*self.runner.tasks.cancel(), *self.supervisor.cancel()]
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.checks.close()
        await self.drivers.close()
        self.store.close()

    # --- accepting work ----------------------------------------------------------------------

    async def create(self, req: CreateMachine, hold: float | None = None) -> Machine:
        """`hold`: seconds the machine stays provisional (see `holds`) unless confirmed."""
        machine_id = req.id or admission.new_machine_id()
        admission.check_runnable(self.drivers, self.settings, req.config)
        until = None if hold is None else time.time() + min(max(hold, 0.0), holds.MAX_HOLD)

        def record(tx: Tx) -> None:
            admission.create(tx, self.settings, machine_id, req, until)

        await self.store.write(record)
        if req.start:
            self.runner.kick(machine_id)
        if until is not None:
            self.holds.poke()
        return self.get(machine_id, events=False)

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
        """Queue start, stop, restart or destroy; returns once the operation is durably accepted."""
        op, params = OPERATIONS[op_name], params or {}
        await self.store.write(lambda tx: admission.accept(tx, machine_id, op, params, nonce))
        self.runner.kick(machine_id)  # also when already on its way: its queue must be running
        return self.get(machine_id, events=False)

    async def update(
        self,
        machine_id: str,
        config: MachineConfig,
        start: bool | None = None,
        nonce: str | None = None,
    ) -> Machine:
        """New config and instance id, in place; refused when the new size does not fit here.

        The new config and instance id are the machine's from the moment the update is accepted
        (so the answer carries them); a running machine is then stopped and started again on it.
        """
        admission.check_runnable(self.drivers, self.settings, config)

        def accept(tx: Tx) -> None:
            admission.update(tx, self.settings, machine_id, config, start, nonce)

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

    # --- reading -----------------------------------------------------------------------------

    def get(self, machine_id: str, events: bool = True) -> Machine:
        row = queries.existing_machine(self.store.read, machine_id)
        return self.machine_from_row(row, self.events(machine_id) if events else [])

    def machines(self, app: str | None = None, include_destroyed: bool = False) -> list[Machine]:
        rows = queries.machines(self.store.read, app, include_destroyed)
        return [self.machine_from_row(row, []) for row in rows]

    def events(self, machine_id: str, limit: int = 100) -> list[MachineEvent]:
        return [
            MachineEvent(
                id=r["seq"],
                type=f"{r['op']}.{r['step']}",
                status=r["state"] or "",
                timestamp=int(r["ts"] * 1000),
                request=json.loads(r["data"]),
            )
            for r in queries.events(self.store.read, machine_id, limit)
        ]

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
            stalled_operations=0 if fault is None else queries.pending_count(self.store.read),
        )
        s = self.settings
        return WorkerStatus(
            worker=s.name, region=s.region, storage=storage, bus=bus_status(self.bus_link)
        )

    def capacity(self) -> Capacity:
        return admission.capacity(self.store.read, self.settings)

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
            settled = not queries.has_pending(self.store.read, machine_id)
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
        return Machine(
            id=row["id"],
            name=row["name"],
            app=row["app"],
            region=self.settings.region,
            state=row["state"],
            instance_id=row["instance_id"],
            config=MachineConfig.model_validate_json(row["config"]),
            worker=self.settings.name,
            private_ip=row["private_ip"],
            restart_count=row["restart_count"],
            exit_code=row["exit_code"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            events=events or [],
            checks=self.following.observed(row),
        )

    def _wake_waiters(self, commit: Commit) -> None:
        for kind, key in commit.touched:
            if kind == "machine":
                event = self._changed.pop(key, None)
                if event is not None:
                    event.set()

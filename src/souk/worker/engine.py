"""The worker's engine: accepts operations, runs their steps in order and supervises processes.

An operation is accepted in one transaction that checks it against the machine's *projected*
state (its state once every queued operation has run) and queues it. A runner per machine then
executes the queued operations one at a time, committing every step to the log as it completes.
After a crash, `recover()` adopts the processes that survived and resumes each queued operation
at its first unlogged step.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from typing import Any

from souk.models.api import NONCE_HEADER, Lease
from souk.models.capacity import Capacity, Offer, OfferRequest, Resources
from souk.models.machine import (
    Check,
    CheckStatus,
    CreateMachine,
    Machine,
    MachineConfig,
    MachineEvent,
    MachineState,
    MetadataChange,
)
from souk.web import ApiError
from souk.worker import app_users
from souk.worker.checks import HealthChecks
from souk.worker.drivers.base import Driver, DriverKind, Drivers, Handle, Launch
from souk.worker.fsm import OPERATIONS, TRANSITIONS, Operation, Step, check_transition
from souk.worker.settings import WorkerSettings
from souk.worker.store import Commit, Store, Tx, now_iso

log = logging.getLogger("souk.worker")

BACKOFF_BASE = 0.05
BACKOFF_MAX = 10.0
HEALTHY_AFTER = 10.0  # a run this long resets the crash streak, and with it the backoff
_STOP_STEPS = OPERATIONS["stop"].steps
STOPPING_OPS = ("stop", "restart", "update", "destroy")
StepFn = Callable[[str, int, Operation, int, dict[str, Any]], Awaitable[int]]


def new_machine_id() -> str:
    return secrets.token_hex(7)


def new_instance_id() -> str:
    return f"{int(time.time() * 1000):012X}{secrets.token_hex(4).upper()}"


def backoff(streak: int) -> float:
    return 0.0 if streak <= 1 else min(BACKOFF_BASE * 2 ** (streak - 2), BACKOFF_MAX)


class Engine:
    def __init__(self, settings: WorkerSettings, drivers: Drivers) -> None:
        self.settings = settings
        self.drivers = drivers
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store(settings.db_path, durable=settings.durable)
        self._runners: dict[str, asyncio.Task[None]] = {}
        self._monitors: dict[str, asyncio.Task[None]] = {}
        self._marked_here: set[str] = set()  # spawn markers no earlier worker run can have used
        self._changed: dict[str, asyncio.Event] = {}
        self.checks = HealthChecks()
        self.store.listeners.append(self._wake_waiters)
        self.store.listeners.append(self._follow_checks)
        self.epoch = self._init_meta()

    # --- start-up and recovery -------------------------------------------------------------

    def _init_meta(self) -> str:
        read = self.store.read
        epoch = self.store.meta("epoch")
        if epoch is None:
            # Ordered by creation time, so a replica can tell a newer database from an older one.
            epoch = f"{time.time_ns():016x}-{secrets.token_hex(4)}"
            with self.store.read as conn:  # one-time initialisation, before any writer runs
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('epoch', ?)", (epoch,))
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('name', ?)", (self.settings.name,))
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('cordoned', '0')")
        name = self.store.meta("name")
        if name != self.settings.name:
            raise SystemExit(f"{read} belongs to worker {name!r}, not {self.settings.name!r}")
        return self.store.meta("epoch") or epoch

    async def recover(self) -> None:
        """Log the start, adopt surviving processes, notice the ones that died meanwhile, resume
        operations. The start entry also gives even an empty worker a head to announce, so the
        catalog learns of it (its worker row) from the first heartbeat."""
        await self.store.write(
            lambda tx: tx.log(
                "worker", self.settings.name, "boot", "started", data={"pid": os.getpid()}
            )
        )
        rows = self.store.read.execute(
            "SELECT id, pid, pid_start, marker, state, driver FROM machines"
            " WHERE state IN ('started', 'starting', 'stopping') AND pid IS NOT NULL"
        ).fetchall()
        for row in rows:
            handle = Handle(row["pid"], row["pid_start"])
            found = self._driver(row["driver"]).adopt(row["id"], row["marker"], handle)
            if found is not None:
                if found != handle:
                    await self.store.write(
                        functools.partial(_set_pid, machine_id=row["id"], handle=found)
                    )
                self._monitor(row["id"])
            elif row["state"] == "started":
                await self._exited(row["id"], None)
        pending = self.store.read.execute(
            "SELECT DISTINCT machine FROM operations WHERE done = 0"
        ).fetchall()
        for row in pending:
            self._kick(row["machine"])
        started = self.store.read.execute("SELECT id FROM machines WHERE state = 'started'")
        self._sync_checks([row["id"] for row in started])  # results are not kept across restarts

    async def close(self) -> None:
        tasks = [*self._runners.values(), *self._monitors.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.checks.close()
        await self.drivers.close()
        self.store.close()

    # --- accepting work ----------------------------------------------------------------------

    async def create(self, req: CreateMachine) -> Machine:
        machine_id = req.id or new_machine_id()
        guest = req.config.guest
        settings = self.settings

        self._check_runnable(req.config)

        def reserve(tx: Tx) -> None:
            if tx.one("SELECT value FROM meta WHERE key='cordoned'")["value"] == "1":  # type: ignore[index]
                raise ApiError(409, "cordoned", f"worker {settings.name} is cordoned")
            if guest.cpu_kind not in settings.cpu_kinds:
                raise ApiError(
                    412,
                    "insufficient_capacity",
                    f"worker {settings.name} has no {guest.cpu_kind} cpus",
                    {"cpu_kinds": list(settings.cpu_kinds)},
                )
            free = _free(tx, settings)
            if guest.cpus > free.cpus or guest.memory_mb > free.memory_mb:
                raise ApiError(
                    412,
                    "insufficient_capacity",
                    f"does not fit: asked {guest.cpus} cpus, {guest.memory_mb} MB;"
                    f" free {free.cpus} cpus, {free.memory_mb} MB",
                    {"free": free.model_dump(), "asked": guest.model_dump()},
                )
            if tx.one("SELECT 1 FROM machines WHERE id = ?", (machine_id,)):
                raise ApiError(409, "already_exists", f"machine {machine_id} already exists")
            stamp = now_iso()
            tx.execute(
                "INSERT INTO machines (id, name, app, state, projected, instance_id, config,"
                " cpu_kind, cpus, memory_mb, reserved, private_ip, created_at, updated_at, seq)"
                " VALUES (?, ?, ?, 'created', 'created', ?, ?, ?, ?, ?, 1, ?, ?, ?, 0)",
                (
                    machine_id,
                    req.name or machine_id,
                    req.app,
                    new_instance_id(),
                    req.config.model_dump_json(),
                    guest.cpu_kind,
                    guest.cpus,
                    guest.memory_mb,
                    _free_ip(tx, Drivers.kind_of(req.config)),
                    stamp,
                    stamp,
                ),
            )
            tx.log(
                "machine",
                machine_id,
                "create",
                "reserve",
                "created",
                data={"app": req.app, "guest": guest.model_dump()},
            )
            _adjust_reserved(tx, settings, guest.cpus, guest.memory_mb, 1, f"machine {machine_id}")
            if req.start:
                _enqueue(tx, machine_id, OPERATIONS["start"], "created", {})

        await self.store.write(reserve)
        if req.start:
            self._kick(machine_id)
        return self.get(machine_id, events=False)

    async def submit(
        self,
        machine_id: str,
        op_name: str,
        params: dict[str, Any] | None = None,
        nonce: str | None = None,
    ) -> Machine:
        """Queue start, stop, restart or destroy; returns once the operation is durably accepted."""
        op = OPERATIONS[op_name]
        params = params or {}

        def accept(tx: Tx) -> bool:
            row = _machine_row(tx, machine_id)
            _check_lease(tx, machine_id, nonce)
            projected: MachineState = row["projected"]
            if op.ends_in is not None and projected == op.ends_in and op.name != "restart":
                return False  # already there or on its way: nothing to do
            if op.name == "destroy" and projected in ("started", "starting"):
                if not params.get("force"):
                    raise ApiError(
                        409,
                        "invalid_state",
                        f"machine {machine_id} is {projected}: stop it first, or force",
                    )
            elif projected not in op.allowed_from:
                raise ApiError(
                    409,
                    "invalid_state",
                    f"machine {machine_id} is {projected}: cannot {op.name} it",
                )
            _enqueue(tx, machine_id, op, projected, params)
            return True

        if await self.store.write(accept):
            self._kick(machine_id)
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
        settings = self.settings
        self._check_runnable(config)

        def accept(tx: Tx) -> bool:
            row = _machine_row(tx, machine_id)
            _check_lease(tx, machine_id, nonce)
            projected: MachineState = row["projected"]
            if projected in ("destroying", "destroyed"):
                raise ApiError(409, "invalid_state", f"machine {machine_id} is {projected}")
            guest = config.guest
            if guest.cpu_kind not in settings.cpu_kinds:
                raise ApiError(
                    412,
                    "insufficient_capacity",
                    f"worker {settings.name} has no {guest.cpu_kind} cpus",
                )
            d_cpus, d_mem = guest.cpus - row["cpus"], guest.memory_mb - row["memory_mb"]
            free = _free(tx, settings)
            if d_cpus > free.cpus or d_mem > free.memory_mb:
                raise ApiError(
                    412,
                    "insufficient_capacity",
                    f"the new size does not fit on worker {settings.name}: free {free.cpus}"
                    f" cpus, {free.memory_mb} MB; create a new machine elsewhere instead",
                    {"free": free.model_dump()},
                )
            instance_id = new_instance_id()
            old = MachineConfig.model_validate_json(row["config"])
            if Drivers.kind_of(old) != Drivers.kind_of(config):  # a command became an image
                tx.execute(
                    "UPDATE machines SET private_ip = ? WHERE id = ?",
                    (_free_ip(tx, Drivers.kind_of(config)), machine_id),
                )
            tx.execute(
                "UPDATE machines SET cpus = ?, memory_mb = ?, cpu_kind = ?, config = ?,"
                " instance_id = ?, updated_at = ? WHERE id = ?",
                (
                    guest.cpus,
                    guest.memory_mb,
                    guest.cpu_kind,
                    config.model_dump_json(),
                    instance_id,
                    now_iso(),
                    machine_id,
                ),
            )
            _adjust_reserved(tx, settings, d_cpus, d_mem, 0, f"update {machine_id}")
            running = projected in ("started", "starting")
            if running:
                _enqueue(tx, machine_id, OPERATIONS["stop"], projected, {})
            after = "stopped" if running else projected
            _enqueue(tx, machine_id, OPERATIONS["update"], after, {"instance_id": instance_id})
            if running if start is None else start:
                _enqueue(tx, machine_id, OPERATIONS["start"], after, {})
            return True

        await self.store.write(accept)
        self._kick(machine_id)
        return self.get(machine_id, events=False)

    def _check_runnable(self, config: MachineConfig) -> None:
        if self.drivers.get(Drivers.kind_of(config)) is None:
            raise ApiError(
                412,
                "insufficient_capacity",
                f"worker {self.settings.name} does not run images (it needs root and runc)",
                {"image": config.image},
            )

    async def patch_metadata(
        self, machine_id: str, patch: MetadataChange, nonce: str | None = None
    ) -> Machine:
        """Change config.metadata in place: same instance, no restart (the proxy and the CLI
        keep their marks there)."""

        def apply(tx: Tx) -> None:
            row = _machine_row(tx, machine_id)
            _check_lease(tx, machine_id, nonce)
            if row["state"] == "destroyed":
                raise ApiError(409, "invalid_state", f"machine {machine_id} is destroyed")
            config = MachineConfig.model_validate_json(row["config"])
            metadata = {k: v for k, v in config.metadata.items() if k not in patch.delete}
            metadata.update(patch.set)
            new = config.model_copy(update={"metadata": metadata})
            tx.execute(
                "UPDATE machines SET config = ?, updated_at = ? WHERE id = ?",
                (new.model_dump_json(), now_iso(), machine_id),
            )
            tx.log("machine", machine_id, "metadata", "patch", None, data=patch.model_dump())

        await self.store.write(apply)
        return self.get(machine_id, events=False)

    async def acquire_lease(
        self, machine_id: str, ttl: int, description: str, owner: str, nonce: str | None
    ) -> Lease:
        """A new lease, or the holder's own extended (same nonce); 409 while another holds one.
        The check and the write are one transaction here, on the machine's only writer."""

        def apply(tx: Tx) -> Lease:
            row = _machine_row(tx, machine_id)
            held = _lease(tx, machine_id)
            if held is not None and held.nonce != nonce:
                raise ApiError(
                    409, "lease_held", f"machine {machine_id} is leased until {held.expires_at}"
                )
            lease = Lease(
                nonce=held.nonce if held is not None else secrets.token_hex(8),
                expires_at=int(time.time() + ttl),
                owner=owner,
                description=description or (held.description if held else ""),
                version=row["instance_id"],
            )
            tx.execute(
                "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?)",
                (
                    machine_id,
                    lease.nonce,
                    lease.owner,
                    lease.description,
                    lease.version,
                    lease.expires_at,
                ),
            )
            tx.log(
                "machine",
                machine_id,
                "lease",
                "acquire",
                None,
                data={"owner": owner, "expires_at": lease.expires_at},
            )
            return lease

        return await self.store.write(apply)

    def lease(self, machine_id: str) -> Lease | None:
        self.get(machine_id, events=False)
        row = self.store.read.execute(
            "SELECT * FROM leases WHERE machine = ? AND expires_at > ?", (machine_id, time.time())
        ).fetchone()
        return None if row is None else _lease_of(row)

    async def release_lease(self, machine_id: str, nonce: str | None) -> None:
        def apply(tx: Tx) -> None:
            _machine_row(tx, machine_id)
            held = _lease(tx, machine_id)
            if held is None:
                raise ApiError(404, "not_found", f"machine {machine_id} has no lease")
            if held.nonce != nonce:
                raise ApiError(409, "lease_held", f"the {NONCE_HEADER} header does not match")
            tx.execute("DELETE FROM leases WHERE machine = ?", (machine_id,))
            tx.log("machine", machine_id, "lease", "release", None)

        await self.store.write(apply)

    async def set_cordoned(self, cordoned: bool) -> None:
        def apply(tx: Tx) -> None:
            tx.execute("UPDATE meta SET value = ? WHERE key = 'cordoned'", (str(int(cordoned)),))
            tx.log("worker", self.settings.name, "cordon" if cordoned else "uncordon", "set")

        await self.store.write(apply)

    # --- reading -----------------------------------------------------------------------------

    def get(self, machine_id: str, events: bool = True) -> Machine:
        row = self.store.read.execute(
            "SELECT * FROM machines WHERE id = ?", (machine_id,)
        ).fetchone()
        if row is None:
            raise ApiError(404, "not_found", f"no machine {machine_id} on this worker")
        return self.machine_from_row(row, self.events(machine_id) if events else [])

    def machines(self, app: str | None = None, include_destroyed: bool = False) -> list[Machine]:
        sql, args = "SELECT * FROM machines WHERE 1=1", []
        if app:
            sql, args = sql + " AND app = ?", [app]
        if not include_destroyed:
            sql += " AND state != 'destroyed'"
        rows = self.store.read.execute(sql + " ORDER BY created_at, id", args).fetchall()
        return [self.machine_from_row(row, []) for row in rows]

    def events(self, machine_id: str, limit: int = 100) -> list[MachineEvent]:
        rows = self.store.read.execute(
            "SELECT seq, ts, op, step, state, data FROM oplog WHERE resource = ?"
            " ORDER BY seq DESC LIMIT ?",
            (machine_id, limit),
        ).fetchall()
        return [
            MachineEvent(
                id=r["seq"],
                type=f"{r['op']}.{r['step']}",
                status=r["state"] or "",
                timestamp=int(r["ts"] * 1000),
                request=json.loads(r["data"]),
            )
            for r in rows
        ]

    def offer(self, req: OfferRequest) -> Offer:
        """Would this guest fit here now? A hint for ranking; only a reservation decides."""
        cap = self.capacity()
        fits = (
            not cap.cordoned
            and req.guest.cpu_kind in cap.cpu_kinds
            and req.guest.cpus <= cap.free.cpus
            and req.guest.memory_mb <= cap.free.memory_mb
        )
        if req.image and self.drivers.image is None:
            fits = False  # this worker cannot run images at all
        return Offer(fits=fits, image_cached=self.drivers.image_cached(req.image), capacity=cap)

    def capacity(self) -> Capacity:
        s = self.settings
        row = self.store.read.execute("SELECT * FROM capacity").fetchone()
        reserved = (
            Resources(cpus=row["cpus"], memory_mb=row["memory_mb"])
            if row
            else (Resources(cpus=0, memory_mb=0))
        )
        return Capacity(
            worker=s.name,
            region=s.region,
            cpu_kinds=list(s.cpu_kinds),
            total=Resources(cpus=s.cpus, memory_mb=s.memory_mb),
            reserved=reserved,
            free=Resources(cpus=s.cpus - reserved.cpus, memory_mb=s.memory_mb - reserved.memory_mb),
            machines=row["machines"] if row else 0,
            labels=s.labels,
            cordoned=self.store.meta("cordoned") == "1",
        )

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
            settled = not self.store.read.execute(
                "SELECT 1 FROM operations WHERE machine = ? AND done = 0", (machine_id,)
            ).fetchone()
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
            checks=self._observed_checks(row),
        )

    def _observed_checks(self, row: Any) -> list[CheckStatus]:
        """The checks of the row's process. The commit listener may not have run yet when a
        reader sees a new state: a started machine is followed here at once, so that no answer
        says `started` without its checks, and no other state carries any."""
        if row["state"] != "started":
            return []
        if not self.checks.following(row["id"], _check_key(row)) and not self.checks.closed:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # read from another thread: the listener will catch up
                return self.checks.statuses(row["id"])
            self._sync_checks([row["id"]])
        return self.checks.statuses(row["id"])

    def _wake_waiters(self, commit: Commit) -> None:
        for kind, key in commit.touched:
            if kind == "machine":
                event = self._changed.pop(key, None)
                if event is not None:
                    event.set()

    def _follow_checks(self, commit: Commit) -> None:
        if not self.checks.closed:
            self._sync_checks([key for kind, key in commit.touched if kind == "machine"])

    def _sync_checks(self, machine_ids: list[str]) -> None:
        """Check each machine's current process while it is started; forget results otherwise.
        One query per batch of machines: this runs after every commit."""
        for i in range(0, len(machine_ids), 500):
            batch = machine_ids[i : i + 500]
            rows = self.store.read.execute(
                "SELECT id, instance_id, pid, private_ip, json_extract(config, '$.checks') checks"
                " FROM machines WHERE state = 'started'"
                f" AND id IN ({', '.join('?' * len(batch))})",
                batch,
            ).fetchall()
            started = {row["id"]: row for row in rows}
            for machine_id in batch:
                row = started.get(machine_id)
                if row is None:
                    self.checks.forget(machine_id)
                    continue
                key = _check_key(row)
                if not self.checks.following(machine_id, key):
                    checks = json.loads(row["checks"] or "{}")
                    self.checks.follow(
                        machine_id, key, {n: Check.model_validate(c) for n, c in checks.items()}
                    )

    # --- running operations ------------------------------------------------------------------

    def _kick(self, machine_id: str) -> None:
        runner = self._runners.get(machine_id)
        if runner is None or runner.done():
            self._runners[machine_id] = asyncio.create_task(self._run_queue(machine_id))

    async def _run_queue(self, machine_id: str) -> None:
        while True:
            row = self.store.read.execute(
                "SELECT * FROM operations WHERE machine = ? AND done = 0 ORDER BY id LIMIT 1",
                (machine_id,),
            ).fetchone()
            if row is None:
                return
            op = OPERATIONS[row["op"]]
            params = json.loads(row["params"])
            index = row["next_step"]
            try:
                while index < len(op.steps):
                    step_fn: StepFn = getattr(self, f"_step_{op.steps[index].name}")
                    index = await step_fn(machine_id, row["id"], op, index, params)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a driver failure: the machine fails, the queue goes on
                log.exception("operation %s on %s failed", op.name, machine_id)
                await self._fail(machine_id, row["id"], op, str(exc))

    async def _advance(
        self,
        machine_id: str,
        op_id: int,
        op: Operation,
        index: int,
        data: dict[str, Any] | None = None,
        **columns: Any,
    ) -> None:
        """Log step `index` of `op` as complete, entering its state, in one transaction."""
        step: Step = op.steps[index]
        last = index == len(op.steps) - 1

        def commit(tx: Tx) -> None:
            row = _machine_row(tx, machine_id)
            state = step.enters or row["state"]
            check_transition(row["state"], state)
            sets = {"state": state, "updated_at": now_iso(), **columns}
            tx.execute(
                f"UPDATE machines SET {', '.join(f'{k} = ?' for k in sets)} WHERE id = ?",
                (*sets.values(), machine_id),
            )
            tx.execute(
                "UPDATE operations SET next_step = ?, done = ? WHERE id = ?",
                (index + 1, int(last), op_id),
            )
            tx.log("machine", machine_id, op.name, step.name, state, op_id, data)
            if last:
                _settle_projection(tx, machine_id)

        await self.store.write(commit)

    async def _fail(self, machine_id: str, op_id: int, op: Operation, error: str) -> None:
        def commit(tx: Tx) -> None:
            row = _machine_row(tx, machine_id)
            state = "failed" if "failed" in TRANSITIONS[row["state"]] else row["state"]
            tx.execute(
                "UPDATE machines SET state = ?, pid = NULL, updated_at = ? WHERE id = ?",
                (state, now_iso(), machine_id),
            )
            tx.execute("UPDATE operations SET done = 1 WHERE id = ?", (op_id,))
            tx.log("machine", machine_id, op.name, "error", state, op_id, {"error": error})
            _settle_projection(tx, machine_id)

        await self.store.write(commit)

    def _queued_after(self, machine_id: str, op_id: int) -> bool:
        row = self.store.read.execute(
            "SELECT 1 FROM operations WHERE machine = ? AND done = 0 AND id > ?",
            (machine_id, op_id),
        ).fetchone()
        return row is not None

    async def _skip(self, machine_id: str, op_id: int, op: Operation, to: int, why: str) -> int:
        """Jump over steps that have nothing to do, logging why; past the end ends the op."""
        done = to >= len(op.steps)

        def commit(tx: Tx) -> None:
            tx.execute(
                "UPDATE operations SET next_step = ?, done = ? WHERE id = ?", (to, int(done), op_id)
            )
            tx.log("machine", machine_id, op.name, "skipped", None, op_id, {"why": why})
            if done:
                _settle_projection(tx, machine_id)

        await self.store.write(commit)
        return to

    def _launch(self, machine_id: str, op_id: int) -> Launch:
        row = self.store.read.execute(
            "SELECT * FROM machines WHERE id = ?", (machine_id,)
        ).fetchone()
        marker = row["marker"] or _spawn_marker(machine_id, op_id)
        return Launch(
            machine_id=machine_id,
            app=row["app"],
            region=self.settings.region,
            instance_id=row["instance_id"],
            config=MachineConfig.model_validate_json(row["config"]),
            marker=marker,
            rundir=self.settings.rundir(machine_id),
            private_ip=row["private_ip"] or "127.0.0.1",
            resumed=marker not in self._marked_here,
            home=app_users.home(self.settings.data_dir, row["app"], machine_id),
        )

    def _driver(self, kind: DriverKind | None) -> Driver:
        driver = self.drivers.get(kind or "command")
        if driver is None:
            raise RuntimeError(f"this worker has no {kind} driver")
        return driver

    def _running_driver(self, machine_id: str) -> Driver:
        """The driver that started the machine's current process (its config may have moved on)."""
        row = self.store.read.execute(
            "SELECT driver FROM machines WHERE id = ?", (machine_id,)
        ).fetchone()
        return self._driver(row["driver"] if row else None)

    def _handle(self, machine_id: str) -> Handle | None:
        row = self.store.read.execute(
            "SELECT pid, pid_start FROM machines WHERE id = ?", (machine_id,)
        ).fetchone()
        return None if row["pid"] is None else Handle(row["pid"], row["pid_start"])

    async def _step_begin_start(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        while (delay := float(p.get("not_before", 0)) - time.time()) > 0:
            if self._queued_after(m, op_id):  # a restart backing off yields to what came next
                return await self._skip(m, op_id, op, len(op.steps), "superseded")
            await asyncio.sleep(min(delay, 0.1))
        marker = _spawn_marker(m, op_id)
        await self._advance(m, op_id, op, i, marker=marker)
        self._marked_here.add(marker)
        return i + 1

    async def _step_spawn(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        launch = await app_users.assign(self.store, self.settings.data_dir, self._launch(m, op_id))
        self._marked_here.discard(launch.marker)
        kind = Drivers.kind_of(launch.config)
        driver = self._driver(kind)
        await driver.prepare(launch)
        if kind == "image":  # prepared means pulled: the cache (and the catalog) has it now
            await self.sync_images()
        handle = await driver.spawn(launch)
        await self._advance(
            m,
            op_id,
            op,
            i,
            {"pid": handle.pid, "driver": kind},
            pid=handle.pid,
            pid_start=handle.pid_start,
            driver=kind,
            exit_code=None,
        )
        self._monitor(m)
        return i + 1

    async def sync_images(self) -> None:
        """Log what the image cache holds now, so the catalog (and through it, placement's
        cached-image bonus) learns of pulls and evictions."""
        cache = self.drivers.images
        if cache is None:
            return
        cached = {image.digest: image for image in await asyncio.to_thread(cache.cached)}

        def apply(tx: Tx) -> None:
            logged = {row["digest"] for row in tx.execute("SELECT digest FROM images")}
            for digest in logged - cached.keys():
                tx.log("image", digest, "cache", "evicted")
                tx.execute("DELETE FROM images WHERE digest = ?", (digest,))
            for digest in cached.keys() - logged:
                image = cached[digest]
                tx.execute(
                    "INSERT INTO images VALUES (?, ?, ?, 0)", (digest, image.ref, image.size)
                )
                tx.log("image", digest, "cache", "pulled", data={"ref": image.ref})

        await self.store.write(apply)

    async def _step_begin_stop(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        state = self.store.read.execute("SELECT state FROM machines WHERE id = ?", (m,)).fetchone()
        if state[0] not in ("started", "starting"):  # it exited meanwhile: nothing to stop
            return await self._skip(m, op_id, op, i + len(_STOP_STEPS), "not running")
        await self._advance(m, op_id, op, i)
        return i + 1

    async def _step_signal(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        config = self._launch(m, op_id).config.stop_config
        signal = p.get("signal") or config.signal
        timeout = p.get("timeout")
        await self._running_driver(m).stop(
            m, self._handle(m), signal, config.timeout if timeout is None else timeout
        )
        await self._advance(m, op_id, op, i, {"signal": signal})
        return i + 1

    async def _step_end_stop(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        await self._advance(m, op_id, op, i, pid=None)
        return i + 1

    async def _step_apply_config(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        """The config was recorded when the update was accepted; this step marks where the
        machine, stopped, takes it on."""
        await self._advance(m, op_id, op, i, {"instance_id": p.get("instance_id")})
        return i + 1

    async def _step_begin_destroy(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        await self._advance(m, op_id, op, i)
        return i + 1

    async def _step_kill(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        config = self._launch(m, op_id).config.stop_config
        if p.get("force"):
            await self._running_driver(m).stop(m, self._handle(m), "SIGKILL", 0)
        else:
            await self._running_driver(m).stop(m, self._handle(m), config.signal, config.timeout)
        await self._advance(m, op_id, op, i, pid=None)
        return i + 1

    async def _step_cleanup(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        launch = self._launch(m, op_id)
        await self._running_driver(m).cleanup(launch)
        if launch.rundir.exists():
            await asyncio.to_thread(shutil.rmtree, launch.rundir, True)
        await self._advance(m, op_id, op, i)
        return i + 1

    async def _step_end_destroy(self, m: str, op_id: int, op: Operation, i: int, p: Any) -> int:
        settings = self.settings
        step = op.steps[i]

        def commit(tx: Tx) -> None:
            row = _machine_row(tx, m)
            if row["reserved"]:
                _adjust_reserved(tx, settings, -row["cpus"], -row["memory_mb"], -1, f"release {m}")
            tx.execute(
                "UPDATE machines SET state = 'destroyed', projected = 'destroyed',"
                " reserved = 0, updated_at = ? WHERE id = ?",
                (now_iso(), m),
            )
            tx.execute(
                "UPDATE operations SET next_step = ?, done = 1 WHERE machine = ? AND done = 0",
                (i + 1, m),
            )
            tx.log("machine", m, op.name, step.name, "destroyed", op_id)

        await self.store.write(commit)
        self._monitors.pop(m, None)
        return len(op.steps)

    # --- supervising processes -----------------------------------------------------------------

    def _monitor(self, machine_id: str) -> None:
        current = self._monitors.get(machine_id)
        if current is not None and not current.done():
            return
        self._monitors[machine_id] = asyncio.create_task(self._watch(machine_id))

    async def _watch(self, machine_id: str) -> None:
        started = time.monotonic()
        code = await self._running_driver(machine_id).wait(machine_id)
        self._monitors.pop(machine_id, None)
        await self._exited(machine_id, code, time.monotonic() - started)

    async def _exited(self, machine_id: str, code: int | None, ran: float = 0.0) -> None:
        """The process is gone. Expected when an operation stopped it; else apply the policy."""

        def commit(tx: Tx) -> bool:
            row = _machine_row(tx, machine_id)
            pending = tx.one(
                "SELECT op FROM operations WHERE machine = ? AND done = 0 ORDER BY id LIMIT 1",
                (machine_id,),
            )
            tx.execute("UPDATE machines SET exit_code = ? WHERE id = ?", (code, machine_id))
            if (pending is not None and pending["op"] in STOPPING_OPS) or row["state"] != "started":
                tx.log(
                    "machine", machine_id, "event", "exit", row["state"], data={"exit_code": code}
                )
                return False
            config = MachineConfig.model_validate_json(row["config"])
            policy = config.restart
            streak = 1 if ran >= HEALTHY_AFTER else row["crash_streak"] + 1
            failed = code != 0  # an unknown code (adopted process) counts as a failure
            restart = policy.policy == "always" or (
                policy.policy == "on-failure"
                and failed
                and row["restart_count"] < policy.max_retries
            )
            final: MachineState = "stopped"
            if not restart and policy.policy == "on-failure" and failed:
                final = "failed"
            tx.execute(
                "UPDATE machines SET state = ?, projected = ?, pid = NULL,"
                " crash_streak = ?, updated_at = ? WHERE id = ?",
                (final, final, streak, now_iso(), machine_id),
            )
            tx.log(
                "machine",
                machine_id,
                "event",
                "exit",
                final,
                data={"exit_code": code, "restart": restart},
            )
            if restart:
                tx.execute(
                    "UPDATE machines SET restart_count = restart_count + 1 WHERE id = ?",
                    (machine_id,),
                )
                _enqueue(
                    tx,
                    machine_id,
                    OPERATIONS["start"],
                    final,
                    {"not_before": time.time() + backoff(streak), "reason": "restart"},
                )
            return restart

        if await self.store.write(commit):
            self._kick(machine_id)


# --- helpers that run inside a transaction ------------------------------------------------------


def _spawn_marker(machine_id: str, op_id: int) -> str:
    """Unique per start operation: how a restarted worker tells that start's process apart."""
    return f"{machine_id}.{op_id}"


def _check_key(row: Any) -> tuple[str, int | None, str]:
    """Which process of the machine its check results are about."""
    return (row["instance_id"], row["pid"], row["private_ip"] or "127.0.0.1")


def _machine_row(tx: Tx, machine_id: str) -> Any:
    row = tx.one("SELECT * FROM machines WHERE id = ?", (machine_id,))
    if row is None:
        raise ApiError(404, "not_found", f"no machine {machine_id} on this worker")
    return row


def _lease_of(row: Any) -> Lease:
    return Lease(
        nonce=row["nonce"],
        owner=row["owner"],
        description=row["description"],
        version=row["version"],
        expires_at=int(row["expires_at"]),
    )


def _lease(tx: Tx, machine_id: str) -> Lease | None:
    row = tx.one(
        "SELECT * FROM leases WHERE machine = ? AND expires_at > ?", (machine_id, time.time())
    )
    return None if row is None else _lease_of(row)


def _check_lease(tx: Tx, machine_id: str, nonce: str | None) -> None:
    """Writers must present the nonce of a held lease."""
    held = _lease(tx, machine_id)
    if held is not None and held.nonce != nonce:
        raise ApiError(
            409,
            "lease_held",
            f"machine {machine_id} is leased until {held.expires_at}; send its nonce in the"
            f" {NONCE_HEADER} header",
        )


def _enqueue(
    tx: Tx, machine_id: str, op: Operation, projected: MachineState, params: dict[str, Any]
) -> None:
    cur = tx.execute(
        "INSERT INTO operations (machine, op, params, created_at) VALUES (?, ?, ?, ?)",
        (machine_id, op.name, json.dumps(params), time.time()),
    )
    tx.execute(
        "UPDATE machines SET projected = ? WHERE id = ?", (op.ends_in or projected, machine_id)
    )
    tx.log("machine", machine_id, op.name, "accepted", None, int(cur.lastrowid or 0), params)


def _settle_projection(tx: Tx, machine_id: str) -> None:
    """With no operation left queued, the projected state is simply the state."""
    if not tx.one("SELECT 1 FROM operations WHERE machine = ? AND done = 0", (machine_id,)):
        tx.execute("UPDATE machines SET projected = state WHERE id = ?", (machine_id,))


def _set_pid(tx: Tx, machine_id: str, handle: Handle) -> None:
    tx.execute(
        "UPDATE machines SET pid = ?, pid_start = ? WHERE id = ?",
        (handle.pid, handle.pid_start, machine_id),
    )
    tx.log("machine", machine_id, "event", "adopted", None, data={"pid": handle.pid})


def _free(tx: Tx, settings: WorkerSettings) -> Resources:
    row = tx.one("SELECT cpus, memory_mb FROM capacity")
    cpus, mem = (row["cpus"], row["memory_mb"]) if row else (0, 0)
    return Resources(cpus=settings.cpus - cpus, memory_mb=settings.memory_mb - mem)


def _adjust_reserved(
    tx: Tx, settings: WorkerSettings, cpus: int, memory_mb: int, machines: int, why: str
) -> None:
    tx.execute(
        "UPDATE capacity SET cpus = cpus + ?, memory_mb = memory_mb + ?, machines = machines + ?",
        (cpus, memory_mb, machines),
    )
    tx.log(
        "worker",
        settings.name,
        "reserve",
        "adjust",
        None,
        data={"cpus": cpus, "memory_mb": memory_mb, "for": why},
    )


def _free_ip(tx: Tx, kind: DriverKind) -> str:
    """An address of the machine's own, so that two machines of one app can bind one port.

    A host command gets a loopback address (all of 127.0.0.0/8 is the host's); a container gets
    one in 10.200.0.0/13, routed to its own network namespace. Drawn at random, so that the
    several workers of one host (as in `souk dev`) almost never draw the same."""
    while True:
        a, b, c = os.urandom(3)
        if kind == "command":
            ip = f"127.{a % 254 + 1}.{b}.{c % 254 + 1}"
        else:
            ip = f"10.{200 + a % 8}.{b}.{c % 253 + 2}"
        if not tx.one(
            "SELECT 1 FROM machines WHERE private_ip = ? AND state != 'destroyed'", (ip,)
        ):
            return ip

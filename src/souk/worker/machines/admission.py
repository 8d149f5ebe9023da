"""Accepting work: whether a request may proceed here, decided and recorded in one transaction.

A create reserves its whole guest against the worker's capacity counters, an update reserves
its growth, and an operation is checked against the machine's *projected* state (its state once
every queued operation has run) before it is queued. Every transaction runs on the store's one
writer, so two requests can never both take the last of something. Whether a guest fits is
`souk.models.fit.misfit`, the rule the broker guesses with: both name a refusal the same way.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from souk.models import machine as machine_models
from souk.models.capacity import Capacity, Offer, OfferRequest, Resources
from souk.models.fit import Misfit, misfit
from souk.models.machine import (
    CreateMachine,
    GuestConfig,
    MachineConfig,
    MachineState,
    MetadataChange,
)
from souk.models.wire import DEFAULT_NETWORK
from souk.worker.drivers.base import Drivers
from souk.worker.errors import (
    AlreadyExists,
    Cordoned,
    InvalidState,
    MetadataTooLarge,
    NoRoom,
    WorkerError,
)
from souk.worker.machines import leases
from souk.worker.machines.addresses import free_ip
from souk.worker.machines.operations import MACHINES, force_destroy
from souk.worker.ops.fsm import OPERATIONS, MachineOperation
from souk.worker.ops.progress import enqueue
from souk.worker.settings import WorkerSettings
from souk.worker.state import queries
from souk.worker.state.queries import Db
from souk.worker.state.store import Tx, now_iso
from souk.worker.volumes import operations as volumes


def new_machine_id() -> str:
    return secrets.token_hex(7)


def new_instance_id() -> str:
    return f"{int(time.time() * 1000):012X}{secrets.token_hex(4).upper()}"


# --- capacity -----------------------------------------------------------------------------------


def capacity(db: Db, settings: WorkerSettings, volumes_refused: str | None = None) -> Capacity:
    cpus, memory_mb, machines = queries.reserved(db)
    disk_total, disk_reserved = volumes.disk(db, settings)
    return Capacity(
        worker=settings.name,
        region=settings.region,
        cpu_kinds=list(settings.cpu_kinds),
        total=Resources(cpus=settings.cpus, memory_mb=settings.memory_mb),
        reserved=Resources(cpus=cpus, memory_mb=memory_mb),
        free=Resources(cpus=settings.cpus - cpus, memory_mb=settings.memory_mb - memory_mb),
        machines=machines,
        disk_mb_total=disk_total,
        disk_mb_reserved=disk_reserved,
        disk_mb_free=disk_total - disk_reserved,
        labels=settings.labels,
        cordoned=queries.cordoned(db),
        volumes_refused=volumes_refused,
    )


def offer(req: OfferRequest, cap: Capacity, drivers: Drivers) -> Offer:
    """Would this guest fit here now? A hint for ranking; only a reservation decides."""
    guest = req.guest
    fits = _misfit(guest, guest.cpus, guest.memory_mb, cap, cordoned=cap.cordoned) is None
    if req.image and drivers.image is None:
        fits = False  # this worker cannot run images at all
    return Offer(fits=fits, image_cached=drivers.image_cached(req.image), capacity=cap)


def reserve(
    tx: Tx, settings: WorkerSettings, cpus: int, memory_mb: int, machines: int, why: str
) -> None:
    """Move the reservation counters (negative: release), logging what for."""
    queries.adjust_reserved(tx, cpus, memory_mb, machines)
    tx.log(
        "worker",
        settings.name,
        "reserve",
        "adjust",
        None,
        data={"cpus": cpus, "memory_mb": memory_mb, "for": why},
    )


def _misfit(
    guest: GuestConfig, cpus: int, memory_mb: int, cap: Capacity, cordoned: bool
) -> Misfit | None:
    return misfit(
        guest.cpu_kind,
        cpus,
        memory_mb,
        kinds=cap.cpu_kinds,
        cpus_free=cap.free.cpus,
        memory_mb_free=cap.free.memory_mb,
        cordoned=cordoned,
        draining=cap.draining,
    )


def _refusal(found: Misfit, message: str, details: dict[str, Any] | None) -> WorkerError:
    """A cordon is a conflict (the worker could take it, and will not); the rest do not fit."""
    if found.kind == "cordoned":
        return Cordoned(message)
    return NoRoom(message, details)


def check_runnable(drivers: Drivers, settings: WorkerSettings, config: MachineConfig) -> None:
    if drivers.get(Drivers.kind_of(config)) is None:
        raise NoRoom(
            f"worker {settings.name} does not run images (it needs root and runc)",
            {"image": config.image},
        )
    if config.image and config.processes and not getattr(drivers.image, "runs_processes", False):
        raise NoRoom(
            f"worker {settings.name} runs no processes of images (vm driver, runc with souk-init)",
            {"image": config.image},
        )


# --- fences ------------------------------------------------------------------------------------

FENCE_FOR = 30 * 60.0  # longer than TCP retransmits a request whose connection is gone (~15 min)
MAX_FENCES = 100_000


class Fences:
    """Ids a broker destroyed because it lost the answer to their create: a create of one of
    them arriving later (its request held up in the network while the destroy went through) is
    refused, so the broker's cleanup, once answered, is final. Kept in memory: a create held up
    on a connection cannot outlive the process that would have answered it."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def fence(self, machine_id: str) -> None:
        now = time.monotonic()
        if len(self._until) >= MAX_FENCES:
            self._until = {k: t for k, t in self._until.items() if t > now}
            while len(self._until) >= MAX_FENCES:
                del self._until[next(iter(self._until))]
        self._until[machine_id] = now + FENCE_FOR

    def holds(self, machine_id: str | None) -> bool:
        if machine_id is None:
            return False
        until = self._until.get(machine_id)
        return until is not None and until > time.monotonic()


# --- requests -----------------------------------------------------------------------------------


def create(
    tx: Tx,
    settings: WorkerSettings,
    machine_id: str,
    req: CreateMachine,
    hold_until: float | None = None,
) -> None:
    """Reserve the guest and record the machine; queue its start if asked. With `hold_until`,
    the machine is provisional until then (see `holds`), in this same commit."""
    guest = req.config.guest
    cap = capacity(tx, settings)
    found = _misfit(guest, guest.cpus, guest.memory_mb, cap, cordoned=cap.cordoned)
    if found is not None:
        message = f"worker {settings.name}: {found.reason}"
        details: dict[str, Any] | None = None
        if found.kind == "cpu_kind":
            details = {"cpu_kinds": list(settings.cpu_kinds)}
        elif found.kind == "room":
            details = {"free": cap.free.model_dump(), "asked": guest.model_dump()}
            message += f"; asked {guest.cpus} cpus, {guest.memory_mb} MB"
        raise _refusal(found, message, details)
    if queries.machine_exists(tx, machine_id):
        raise AlreadyExists(f"machine {machine_id} already exists")
    instance_id, stamp = new_instance_id(), now_iso()
    kind, network = Drivers.kind_of(req.config), req.network or DEFAULT_NETWORK
    ip = free_ip(tx, kind, settings.private_prefix, network, settings.name)
    queries.insert_machine(
        tx, machine_id, req.name or machine_id, req.app, instance_id, req.config, ip, stamp
    )
    volumes.attach(tx, settings, req.app, machine_id, req.config)
    queries.add_version(tx, machine_id, instance_id, req.config, stamp)
    tx.log(
        "machine",
        machine_id,
        "create",
        "reserve",
        "created",
        data={"app": req.app, "guest": guest.model_dump(), "private_ip": ip, **_ignored(req)},
    )
    reserve(tx, settings, guest.cpus, guest.memory_mb, 1, f"machine {machine_id}")
    if hold_until is not None:
        queries.insert_hold(tx, machine_id, hold_until)
        tx.log("machine", machine_id, "hold", "provisional", None, data={"until": hold_until})
    if req.start:
        enqueue(tx, MACHINES, machine_id, OPERATIONS["start"], "created", {})


def _ignored(req: CreateMachine) -> dict[str, Any]:
    """The fields of its config the broker ignored, for the create event: Fly's clients are
    not refused for them, and the event says what was not taken."""
    return {"ignored_fields": req.ignored_fields} if req.ignored_fields else {}


def accept(
    tx: Tx, machine_id: str, op: MachineOperation, params: dict[str, Any], nonce: str | None
) -> bool:
    """Queue `op` if the machine's projected state allows it; False when there is nothing to do
    (it is in, or on its way to, where the operation ends)."""
    row = queries.existing_machine(tx, machine_id)
    leases.check(tx, machine_id, nonce)
    projected: MachineState = row["projected"]
    if op.name == "destroy" and params.get("force"):
        return force_destroy(tx, machine_id, params)
    if op.ends_in is not None and projected == op.ends_in and op.name != "restart":
        return False
    if op.name == "start" and projected == "suspended":
        op = OPERATIONS["resume"]  # a start of a suspended machine thaws it
    if op.name == "destroy" and projected in ("started", "starting", "suspended"):
        raise InvalidState(f"machine {machine_id} is {projected}: stop it first, or force")
    if projected not in op.allowed_from:
        raise InvalidState(f"machine {machine_id} is {projected}: cannot {op.name} it")
    enqueue(tx, MACHINES, machine_id, op, projected, params)
    return True


def update(
    tx: Tx,
    settings: WorkerSettings,
    machine_id: str,
    config: MachineConfig,
    start: bool | None,
    nonce: str | None,
) -> None:
    """Record the new config and instance id now, reserving the growth; queue the stop (if it
    runs), the update and the start (if it ran, or if asked)."""
    row = queries.existing_machine(tx, machine_id)
    leases.check(tx, machine_id, nonce)
    projected: MachineState = row["projected"]
    if projected in ("destroying", "destroyed"):
        raise InvalidState(f"machine {machine_id} is {projected}")
    guest = config.guest
    d_cpus, d_mem = guest.cpus - row["cpus"], guest.memory_mb - row["memory_mb"]
    cap = capacity(tx, settings)
    found = _misfit(guest, d_cpus, d_mem, cap, cordoned=False)  # a cordon keeps what is here
    if found is not None:
        details = {"free": cap.free.model_dump()} if found.kind == "room" else None
        message = f"the new size does not fit on worker {settings.name}: {found.reason}"
        raise _refusal(found, message + "; create a new machine elsewhere instead", details)
    instance_id = new_instance_id()
    old = MachineConfig.model_validate_json(row["config"])
    kind = Drivers.kind_of(config)
    if Drivers.kind_of(old) != kind and ":" not in (row["private_ip"] or ""):
        # a command became an image, or the reverse, off the private network (whose address
        # serves both)
        ip = free_ip(tx, kind, settings.private_prefix, worker=settings.name)
        queries.set_private_ip(tx, machine_id, ip)
    volumes.attach(tx, settings, row["app"], machine_id, config)
    stamp = now_iso()
    queries.set_config(tx, machine_id, config, stamp, instance_id)
    queries.add_version(tx, machine_id, instance_id, config, stamp)
    reserve(tx, settings, d_cpus, d_mem, 0, f"update {machine_id}")
    running = projected in ("started", "starting", "suspended")
    if running:
        enqueue(tx, MACHINES, machine_id, OPERATIONS["stop"], projected, {})
    after = "stopped" if running else projected
    enqueue(tx, MACHINES, machine_id, OPERATIONS["update"], after, {"instance_id": instance_id})
    if running if start is None else start:
        enqueue(tx, MACHINES, machine_id, OPERATIONS["start"], after, {})


def patch_metadata(tx: Tx, machine_id: str, patch: MetadataChange, nonce: str | None) -> None:
    row = queries.existing_machine(tx, machine_id)
    leases.check(tx, machine_id, nonce)
    if row["state"] == "destroyed":
        raise InvalidState(f"machine {machine_id} is destroyed")
    config = MachineConfig.model_validate_json(row["config"])
    metadata = {k: v for k, v in config.metadata.items() if k not in patch.delete}
    metadata.update(patch.set)
    try:  # each part of a patch may be small while the sum is not: a config must stay readable
        machine_models.check_metadata_size(metadata)
    except machine_models.MetadataTooLarge as exc:
        raise MetadataTooLarge(str(exc)) from None
    new = config.model_copy(update={"metadata": metadata})
    queries.set_config(tx, machine_id, new, now_iso())
    tx.log("machine", machine_id, "metadata", "patch", None, data=patch.model_dump())


def set_cordoned(tx: Tx, settings: WorkerSettings, cordoned: bool) -> None:
    queries.set_cordoned(tx, cordoned)
    tx.log("worker", settings.name, "cordon" if cordoned else "uncordon", "set")

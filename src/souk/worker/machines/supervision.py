"""Supervising machines' processes: noticing when one exits, and the restart policy.

Every process a driver runs (or adopts after a worker restart) has a monitor task awaiting its
exit. An exit an operation asked for is only logged; any other applies the machine's restart
policy, which may queue a start, backing off exponentially while the process keeps crashing.
An exit is recorded however long the data directory takes to accept the write (`patiently`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from souk.models.machine import MachineConfig, MachineState, RestartConfig
from souk.web.metrics import OFF, Off
from souk.worker.drivers.base import Driver, Drivers, Handle
from souk.worker.errors import StorageFault
from souk.worker.machines.operations import MACHINES
from souk.worker.ops.fsm import OPERATIONS
from souk.worker.ops.progress import enqueue
from souk.worker.ops.tasks import ResourceTasks
from souk.worker.state import queries
from souk.worker.state.operations import MACHINE_QUEUE
from souk.worker.state.storage import patiently
from souk.worker.state.store import Store, Tx, now_iso

log = logging.getLogger("souk.worker")

BACKOFF_BASE = 0.05
BACKOFF_MAX = 10.0
HEALTHY_AFTER = 10.0  # a run this long resets the crash streak, and with it the backoff
STOPPING_OPS = ("stop", "restart", "update", "destroy")  # queued first, these expect an exit


def backoff(streak: int) -> float:
    # the power is bounded: a machine crashing for hours must not overflow the float
    return 0.0 if streak <= 1 else min(BACKOFF_BASE * 2 ** min(streak - 2, 16), BACKOFF_MAX)


@dataclass(frozen=True)
class AfterExit:
    state: MachineState
    crash_streak: int
    restart: bool


def after_exit(
    policy: RestartConfig, code: int | None, ran: float, crash_streak: int, restart_count: int
) -> AfterExit:
    """What an unasked-for exit leads to. An unknown code (an adopted process's) is a failure."""
    streak = 1 if ran >= HEALTHY_AFTER else crash_streak + 1
    failed = code != 0
    restart = policy.policy == "always" or (
        policy.policy == "on-failure" and failed and restart_count < policy.max_retries
    )
    final: MachineState = "stopped"
    if not restart and policy.policy == "on-failure" and failed:
        final = "failed"
    return AfterExit(final, streak, restart)


class Supervisor:
    """The monitors of one worker's processes; `kick` runs a machine's queue after a restart is
    queued."""

    def __init__(self, store: Store, drivers: Drivers, kick: Callable[[str], None]) -> None:
        self.store = store
        self.drivers = drivers
        self.kick = kick
        self.restarts: Off = OFF  # the worker's restart counter, once it has metrics
        self.monitors = ResourceTasks()
        self._later: set[asyncio.Task[None]] = set()  # writes a full disk put off at start

    def running_driver(self, machine_id: str) -> Driver:
        """The driver that started the machine's current process (its config may have moved on)."""
        return self.drivers.require(queries.driver_of(self.store.read, machine_id))

    def handle(self, machine_id: str) -> Handle | None:
        found = queries.process_of(self.store.read, machine_id)
        return None if found is None else Handle(*found)

    async def adopt(self) -> None:
        """After a worker restart: watch the processes that survived it, and treat the ones that
        died meanwhile as exits."""
        for row in queries.live_processes(self.store.read):
            handle = Handle(row["pid"], row["pid_start"])
            found = self.drivers.require(row["driver"]).adopt(row["id"], row["marker"], handle)
            if found is not None:
                if found != handle:
                    adopted = functools.partial(_adopted, row["id"], found)
                    await self._now_or_later(functools.partial(self.store.write, adopted))
                self.monitor(row["id"])
                if row["state"] == "suspended":
                    # A frozen group stays frozen without its worker; freezing again (a no-op
                    # then) also covers a machine stopped with SIGSTOP by a host without one.
                    try:
                        await self.drivers.require(row["driver"]).freeze(row["id"], found)
                    except Exception as exc:  # still adopted; a start thaws it all the same
                        log.warning("suspended %s not frozen again: %s", row["id"], exc)
            elif row["state"] in ("started", "suspended"):
                await self._now_or_later(functools.partial(self._record_exit, row["id"], None))

    async def _now_or_later(self, write: Callable[[], Awaitable[object]]) -> None:
        """A write at start-up; on a full or read-only disk it goes on in the background, so
        that the worker still comes up (and answers why nothing can change)."""
        try:
            await write()
        except StorageFault:
            task = asyncio.create_task(self._patiently(write))
            self._later.add(task)
            task.add_done_callback(self._later.discard)

    async def _patiently(self, write: Callable[[], Awaitable[object]]) -> None:
        await patiently(self.store.watch, write)

    def cancel(self) -> list[asyncio.Task[None]]:
        """Stop watching (the worker is closing); returns the tasks, to be awaited."""
        later = list(self._later)
        for task in later:
            task.cancel()
        return [*self.monitors.cancel(), *later]

    def monitor(self, machine_id: str) -> None:
        self.monitors.ensure(machine_id, lambda: self._watch(machine_id))

    async def _watch(self, machine_id: str) -> None:
        started = time.monotonic()
        code = await self.running_driver(machine_id).wait(machine_id)
        self.monitors.forget(machine_id)
        await self.exited(machine_id, code, time.monotonic() - started)

    async def exited(self, machine_id: str, code: int | None, ran: float = 0.0) -> None:
        """The process is gone. Expected when an operation stopped it; else apply the policy."""
        record = functools.partial(self._record_exit, machine_id, code, ran)
        await patiently(self.store.watch, record)

    async def _record_exit(self, machine_id: str, code: int | None, ran: float = 0.0) -> None:
        """One try at recording the exit (and queueing a restart if the policy says so, or a
        destroy for a machine with `auto_destroy` that the policy does not restart)."""

        def commit(tx: Tx) -> bool:
            row = queries.existing_machine(tx, machine_id)
            pending = MACHINE_QUEUE.next(tx, machine_id)
            queries.set_exit_code(tx, machine_id, code)
            expected = pending is not None and pending["op"] in STOPPING_OPS
            if expected or row["state"] not in ("started", "suspended"):
                tx.log(
                    "machine", machine_id, "event", "exit", row["state"], data={"exit_code": code}
                )
                return False
            config = MachineConfig.model_validate_json(row["config"])
            then = after_exit(config.restart, code, ran, row["crash_streak"], row["restart_count"])
            queries.set_exited(tx, machine_id, then.state, then.crash_streak, now_iso())
            tx.log(
                "machine",
                machine_id,
                "event",
                "exit",
                then.state,
                data={"exit_code": code, "restart": then.restart},
            )
            if then.restart:
                queries.count_restart(tx, machine_id)
                not_before = time.time() + backoff(then.crash_streak)
                params = {"not_before": not_before, "reason": "restart"}
                enqueue(tx, MACHINES, machine_id, OPERATIONS["start"], then.state, params)
            elif config.auto_destroy:  # done, as Fly's auto_destroy means: nothing left to keep
                params = {"force": True, "reason": "auto_destroy"}
                enqueue(tx, MACHINES, machine_id, OPERATIONS["destroy"], then.state, params)
                return True
            return then.restart

        if await self.store.write(commit):
            self.restarts.inc()
            self.kick(machine_id)


def _adopted(machine_id: str, handle: Handle, tx: Tx) -> None:
    queries.set_process(tx, machine_id, handle.pid, handle.pid_start)
    tx.log("machine", machine_id, "event", "adopted", None, data={"pid": handle.pid})

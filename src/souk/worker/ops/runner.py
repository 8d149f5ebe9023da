"""The operation runner: one task per machine with queued operations, running them in order,
one step at a time, each step found in the table of step implementations.

A step that fails because the data directory cannot take its commit (full, read-only) has not
happened as far as the log knows: it is run again, after a backoff that any successful commit
cuts short, so an acknowledged operation completes once the disk has room again. Any other
failure fails the operation and the queue goes on.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time

from aiohttp import ClientError

from souk.logsetup import about
from souk.worker.errors import WorkerError
from souk.worker.metrics import WorkerMetrics
from souk.worker.oci.auth import AuthError
from souk.worker.oci.manifest import ManifestError
from souk.worker.oci.reference import ReferenceError as BadReference
from souk.worker.oci.registry import RegistryError
from souk.worker.ops.fsm import OPERATIONS
from souk.worker.ops.progress import StepRun, Superseded, fail
from souk.worker.ops.steps import STEPS, StepHost
from souk.worker.ops.tasks import MachineTasks
from souk.worker.state import queries
from souk.worker.state.storage import patiently
from souk.worker.state.store import Store

log = logging.getLogger("souk.worker")
# Failures that are the request's or a registry's (no such image, a bad reference, a refusal, a
# registry out of reach): one line with the reason; anything else is unforeseen and logged with
# its traceback.
EXPECTED = (WorkerError, RegistryError, AuthError, ManifestError, BadReference, ClientError)


class Runner:
    def __init__(self, store: Store, host: StepHost, metrics: WorkerMetrics | None = None) -> None:
        self.store = store
        self.host = host
        self.metrics = metrics or WorkerMetrics(enabled=False)
        self.tasks = MachineTasks()

    def kick(self, machine_id: str) -> None:
        """Make sure the machine's queue is being run."""
        self.tasks.ensure(machine_id, lambda: self._run_queue(machine_id))

    def preempt(self, machine_id: str) -> None:
        """Run the machine's queue afresh: the step running now belongs to an operation a
        forced destroy superseded (`progress.force_destroy`), so it is cancelled where it waits
        (a stop's timeout, an image pull), not waited for."""
        self.tasks.replace(machine_id, lambda: self._run_queue(machine_id))

    async def _run_queue(self, machine_id: str) -> None:
        waits = 0  # storage faults in a row
        while True:
            row = queries.next_operation(self.store.read, machine_id)
            if row is None:
                return
            op = OPERATIONS[row["op"]]
            params = json.loads(row["params"])
            index = row["next_step"]
            timed, outcomes = self.metrics.steps[op.name], self.metrics.operations[op.name]
            try:
                while index < len(op.steps):
                    run = StepRun(machine_id, row["id"], op, index, params)
                    name, began = op.steps[index].name, time.perf_counter()
                    index = await STEPS[name](self.host, run)
                    timed[name].observe(time.perf_counter() - began)
                    waits = 0
                outcomes["done"].inc()
            except asyncio.CancelledError:
                raise
            except Superseded:  # its work is the destroy's to undo: nothing to log
                continue
            except Exception as exc:
                if self.store.watch.fault_from(exc) is not None:
                    # not logged as done: the step runs again (steps are idempotent)
                    await self.store.watch.pause(waits)
                    waits += 1
                    continue
                # a driver failure: the machine fails, the queue goes on
                outcomes["failed"].inc()
                found = queries.machine(self.store.read, machine_id)
                state = found["state"] if found is not None else None
                log.log(
                    logging.WARNING if isinstance(exc, EXPECTED) else logging.ERROR,
                    "operation %s on %s failed: %s",
                    op.name,
                    machine_id,
                    exc,
                    exc_info=not isinstance(exc, EXPECTED),  # a traceback for the unforeseen only
                    extra=about(machine_id, state, op=op.name),
                )
                failed = functools.partial(fail, self.store, machine_id, row["id"], op, str(exc))
                await patiently(self.store.watch, failed)

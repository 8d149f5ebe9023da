"""The operation runner, one for every kind of resource: a task per resource with queued
operations, running them in order, one step at a time, each step found in its kind's table of
step implementations.

A step that fails because the data directory cannot take its commit (full, read-only) has not
happened as far as the log knows: it is run again, after a backoff that any successful commit
cuts short, so an acknowledged operation completes once the disk has room again. Any other
failure fails the operation (`progress.fail`: the resource's kind says where that leaves it)
and the queue goes on.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Generic, TypeVar

from souk.logsetup import about
from souk.worker.errors import NotFound
from souk.worker.metrics import WorkerMetrics
from souk.worker.ops.progress import Kind, StepRun, Superseded, fail
from souk.worker.ops.steps import StepTable
from souk.worker.ops.tasks import ResourceTasks
from souk.worker.state.storage import patiently
from souk.worker.state.store import Store

H = TypeVar("H")
log = logging.getLogger("souk.worker")


class Runner(Generic[H]):
    """Runs the queues of one kind of resource with its `steps`, each handed `host`; `metrics`
    (a machine's operations) counts and times them."""

    def __init__(
        self,
        store: Store,
        kind: Kind,
        steps: StepTable[H],
        host: H,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.store = store
        self.kind = kind
        self.steps = steps
        self.host = host
        self.metrics = metrics
        self.tasks = ResourceTasks()
        self._idle: dict[str, asyncio.Event] = {}  # set when the resource's queue has run

    def kick(self, resource: str) -> None:
        """Make sure the resource's queue is being run."""
        self.tasks.ensure(resource, lambda: self._run_queue(resource))

    def preempt(self, resource: str) -> None:
        """Run the resource's queue afresh: the step running now belongs to an operation a
        forced destroy superseded (`machines/operations.force_destroy`), so it is cancelled
        where it waits (a stop's timeout, an image pull), not waited for."""
        self.tasks.replace(resource, lambda: self._run_queue(resource))

    def resume(self) -> None:
        """After a (re)start: run every queue with an operation not yet done."""
        for resource in self.kind.queue.with_pending(self.store.read):
            self.kick(resource)

    async def settled(self, resource: str, timeout: float) -> bool:
        """Wait until nothing is queued for the resource (or the timeout)."""
        if not self.kind.queue.has_pending(self.store.read, resource):
            return True
        event = self._idle.setdefault(resource, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _run_queue(self, resource: str) -> None:
        try:
            await self._run(resource)
        finally:  # nothing is queued (or the task is cancelled): whoever waits looks again
            if (event := self._idle.pop(resource, None)) is not None:
                event.set()

    async def _run(self, resource: str) -> None:
        kind, waits = self.kind, 0  # waits: storage faults in a row
        while (row := kind.queue.next(self.store.read, resource)) is not None:
            op = kind.fsm.operations[row["op"]]
            run = StepRun(
                kind, resource, row["id"], op, row["next_step"], json.loads(row["params"])
            )
            try:
                while run.index < len(op.steps):
                    began = time.perf_counter()
                    index = await self.steps[run.step.name](self.host, run)
                    self._timed(run, time.perf_counter() - began)
                    run = StepRun(kind, resource, run.op_id, op, index, run.params)
                    waits = 0
                self._counted(run, "done")
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
                self._counted(run, "failed")
                self._log_failure(run, exc)
                await patiently(
                    self.store.watch, functools.partial(fail, self.store, self.host, run, str(exc))
                )

    def _log_failure(self, run: StepRun, exc: Exception) -> None:
        """One line for a failure its kind expects; its traceback too for any other."""
        try:
            state = self.kind.queue.existing(self.store.read, run.resource)["state"]
        except NotFound:
            state = None
        expected = isinstance(exc, self.kind.expected)
        log.log(
            logging.WARNING if expected else logging.ERROR,
            "operation %s on %s failed: %s",
            run.op.name,
            run.resource,
            exc,
            exc_info=not expected,
            extra=about(run.resource, state, kind=self.kind.name, op=run.op.name),
        )

    def _timed(self, run: StepRun, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.steps[run.op.name][run.step.name].observe(seconds)

    def _counted(self, run: StepRun, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.operations[run.op.name][outcome].inc()

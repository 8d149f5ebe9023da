"""The operation runner: one task per machine with queued operations, running them in order,
one step at a time, each step found in the table of step implementations."""

from __future__ import annotations

import asyncio
import json
import logging

from souk.worker import queries
from souk.worker.fsm import OPERATIONS
from souk.worker.machine_tasks import MachineTasks
from souk.worker.progress import StepRun, fail
from souk.worker.steps import STEPS, StepHost
from souk.worker.store import Store

log = logging.getLogger("souk.worker")


class Runner:
    def __init__(self, store: Store, host: StepHost) -> None:
        self.store = store
        self.host = host
        self.tasks = MachineTasks()

    def kick(self, machine_id: str) -> None:
        """Make sure the machine's queue is being run."""
        self.tasks.ensure(machine_id, lambda: self._run_queue(machine_id))

    async def _run_queue(self, machine_id: str) -> None:
        while True:
            row = queries.next_operation(self.store.read, machine_id)
            if row is None:
                return
            op = OPERATIONS[row["op"]]
            params = json.loads(row["params"])
            index = row["next_step"]
            try:
                while index < len(op.steps):
                    run = StepRun(machine_id, row["id"], op, index, params)
                    index = await STEPS[op.steps[index].name](self.host, run)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a driver failure: the machine fails, the queue goes on
                log.exception("operation %s on %s failed", op.name, machine_id)
                await fail(self.store, machine_id, row["id"], op, str(exc))

"""Reserving on a picked worker: the only step whose answer is final, because the worker alone
judges its capacity, in the same transaction that records the machine.

A reservation whose answer is lost (timeout, broken connection) may still have happened; its
machine id is the broker's, so the broker destroys that id on that worker in the background
before moving on, and the user never holds a machine they were not told about.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from souk.broker.placement.candidates import Candidate
from souk.clients.workers import WorkerClient, WorkerError
from souk.models.api import Refusal
from souk.models.machine import CreateMachine, Machine

log = logging.getLogger("souk.broker")

CLEANUP_TIMEOUT = 30.0


def new_machine_id() -> str:
    return secrets.token_hex(7)


class Reserver:
    """Reserves through one worker client and keeps the cleanups of lost answers running."""

    def __init__(self, client: WorkerClient) -> None:
        self.client = client
        self._cleanups: set[asyncio.Task[None]] = set()

    async def reserve(
        self, cand: Candidate, create: CreateMachine, timeout: float, refusals: list[Refusal]
    ) -> Machine | None:
        """The machine, or None with the worker's refusal added to `refusals`. A create that
        names its own id and finds it taken is the caller's conflict, not a refusal: raised."""
        attempt = create.model_copy(update={"id": create.id or new_machine_id()})
        try:
            return await self.client.create(cand.worker, cand.address, attempt, timeout)
        except WorkerError as exc:
            refusals.append(Refusal(worker=cand.worker, reason=exc.message))
            if exc.http_status == 0:
                self._cleanup(cand, attempt.id or "")
            elif exc.http_status == 409 and exc.reason == "already_exists" and create.id:
                raise
            return None

    @property
    def pending(self) -> int:
        """Cleanups of lost answers still running."""
        return len(self._cleanups)

    def _cleanup(self, cand: Candidate, machine_id: str) -> None:
        async def destroy() -> None:
            try:
                await self.client.destroy(
                    cand.worker, cand.address, machine_id, force=True, timeout=CLEANUP_TIMEOUT
                )
            except WorkerError as exc:
                if exc.http_status != 404:
                    log.warning("could not clean up %s on %s: %s", machine_id, cand.worker, exc)

        task = asyncio.create_task(destroy())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

"""Reserving on a picked worker: the only step whose answer is final, because the worker alone
judges its capacity, in the same transaction that records the machine.

A reservation whose answer is lost (timeout, broken connection) may still have happened, or
may still happen (its request held up in the network); its machine id is the broker's, so the
broker destroys that id on that worker in the background before moving on, fencing it there
(the worker refuses that id's create if it comes later), and retries the destroy with backoff
until the worker answers, for up to `CLEANUP_FOR`. The user never holds a machine they were not
told about (docs/reliability.md states the bound).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time

from souk.broker.liveness import Liveness
from souk.broker.placement.candidates import Candidate
from souk.clients.workers import WorkerClient, WorkerError
from souk.models.api import Refusal
from souk.models.machine import CreateMachine, Machine

log = logging.getLogger("souk.broker")

CLEANUP_TIMEOUT = 10.0  # one attempt
CLEANUP_FOR = 20 * 60.0  # retried this long: longer than TCP retransmits a held-up request
CLEANUP_FIRST, CLEANUP_MAX = 0.25, 30.0  # backoff between attempts


TAG_LENGTH = 4


def worker_tag(worker: str) -> str:
    """A short tag naming the worker, at the end of the ids the broker gives machines: a broker
    whose catalog does not show a machine yet asks only the workers with its tag (see
    `Broker.find`). Not unique: a few workers may share one, and all of them are asked."""
    return hashlib.sha256(worker.encode()).hexdigest()[:TAG_LENGTH]


def new_machine_id(worker: str | None = None, prefix: str | None = None) -> str:
    """14 hex digits, as Fly's: 40 random bits (or the given prefix), then the worker's tag (if
    it is known)."""
    if worker is None:
        return secrets.token_hex(7)
    return (prefix or secrets.token_hex(5)) + worker_tag(worker)


def keyed_prefix(secret: bytes, app: str, key: str) -> str:
    """The id prefix of an app's create with an idempotency key: the same for every retry, on
    every broker, and not to be guessed without the cluster secret."""
    mac = hmac.new(secret, f"idempotency\0{app}\0{key}".encode(), hashlib.sha256)
    return mac.hexdigest()[: 14 - TAG_LENGTH]


class Reserver:
    """Reserves through one worker client and keeps the cleanups of lost answers running."""

    def __init__(self, client: WorkerClient, liveness: Liveness | None = None) -> None:
        self.client = client
        self.liveness = liveness or Liveness()
        self._cleanups: set[asyncio.Task[None]] = set()

    async def reserve(
        self,
        cand: Candidate,
        create: CreateMachine,
        timeout: float,
        refusals: list[Refusal],
        id_prefix: str | None = None,
    ) -> Machine | None:
        """The machine, or None with the worker's refusal added to `refusals`. A create that
        names its own id and finds it taken is the caller's conflict, not a refusal: raised. A
        keyed create (`id_prefix`) that finds its id taken is a retry that raced the first
        try: that machine is the answer."""
        new_id = create.id or new_machine_id(cand.worker, id_prefix)
        attempt = create.model_copy(update={"id": new_id})
        try:
            machine = await self.client.create(cand.worker, cand.address, attempt, timeout)
        except WorkerError as exc:
            refusals.append(Refusal(worker=cand.worker, reason=exc.message))
            if exc.http_status == 0:
                self.liveness.failed(cand.worker)
                if exc.reason == "untrusted":  # refused before a byte was sent: nothing to undo
                    log.warning("sent no create to %s: %s", cand.worker, exc.message)
                else:
                    self._cleanup(cand, attempt.id or "")
            elif exc.http_status == 409 and exc.reason == "already_exists" and create.id:
                raise
            elif exc.http_status == 409 and exc.reason == "already_exists" and id_prefix:
                return await self._same(cand, create.app, new_id)
            return None
        self.liveness.answered(cand.worker)
        return machine

    async def _same(self, cand: Candidate, app: str, machine_id: str) -> Machine | None:
        try:
            machine = await self.client.machine(cand.worker, cand.address, machine_id)
        except WorkerError:
            return None
        return machine if machine.app == app else None

    async def close(self) -> None:
        """Cancel the cleanups still running (the broker is stopping)."""
        tasks = list(self._cleanups)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def pending(self) -> int:
        """Cleanups of lost answers still running."""
        return len(self._cleanups)

    def _cleanup(self, cand: Candidate, machine_id: str) -> None:
        async def destroy() -> None:
            end, delay = time.monotonic() + CLEANUP_FOR, CLEANUP_FIRST
            while True:
                try:
                    await self.client.destroy(
                        cand.worker,
                        cand.address,
                        machine_id,
                        force=True,
                        timeout=CLEANUP_TIMEOUT,
                        fence=True,
                    )
                    return
                except WorkerError as exc:
                    if exc.http_status == 404:
                        return  # never created, and fenced: it never will be
                    if 0 < exc.http_status < 500 or time.monotonic() + delay > end:
                        log.warning("could not clean up %s on %s: %s", machine_id, cand.worker, exc)
                        return
                await asyncio.sleep(delay)
                delay = min(delay * 2, CLEANUP_MAX)

        task = asyncio.create_task(destroy())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

"""Reserving on a picked worker: the only step whose answer is final, because the worker alone
judges its capacity, in the same transaction that records the machine.

Every create is *provisional* on the worker for `HOLD_FOR` seconds: the broker confirms it
(`confirm`, batched per worker) once it has answered its client, and the worker destroys a
machine nobody confirmed when its hold ends, by itself, after any crash of either side. So a
machine whose create answer is lost (worker killed after its commit, broker killed before it
answered) is gone within the hold, even if the broker never speaks to that worker again.

A reservation whose answer is lost (timeout, broken connection) may also still happen (its
request held up in the network); its machine id is the broker's, so the broker destroys that id
on that worker in the background before moving on, fencing it there (the worker refuses that
id's create if it comes later), and retries the destroy with backoff for up to the hold: past
it, the worker destroys the machine itself. docs/reliability.md states the bound.

Creates to one worker travel in a lane (`_Lane`): at most `CREATES_IN_FLIGHT` requests at once,
and the creates that arrive while those are out leave together in the next one
(`POST /v1/machines/batch`), answered one by one. A burst onto the worker the policy favours
thus costs it one commit and one request, not one each, and the broker no connection more.
Confirmations due to a worker whose lane is busy ride along with the next request it sends;
only those that find no create to ride with go in a request of their own.

With a bus (`souk broker --reserve-over-bus`, off by default), a lane's request goes as a
`BusReservation` to the worker's own subject instead, answered by the same worker code; a worker
that does not answer there in `BUS_TIMEOUT` (none subscribed, an older worker, a secured worker
on a plain bus) is reserved over HTTP, counted in `bus_fallbacks` and logged.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import itertools
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from souk.broker.liveness import Liveness
from souk.broker.placement.candidates import Candidate
from souk.broker.placement.stages import Noted
from souk.catalog.bus import Bus
from souk.catalog.protocol import reserve_subject
from souk.clients.http import refusal_of
from souk.clients.workers import WorkerCallError, WorkerClient, outcomes_of
from souk.models.api import (
    MAX_BATCH,
    MAX_CONFIRMATIONS,
    BusRefusal,
    BusReservation,
    CreateBatch,
    CreateOutcomes,
    HoldAnswer,
    Refusal,
)
from souk.models.machine import CreateMachine, Machine
from souk.pki import NodeFiles
from souk.web.metrics import OFF, Child, Observer

log = logging.getLogger("souk.broker")

HOLD_FOR = 60.0  # a created machine stays provisional this long on its worker unless confirmed
CLEANUP_TIMEOUT = 10.0  # one attempt
CLEANUP_FIRST, CLEANUP_MAX = 0.25, 30.0  # backoff between attempts
CONFIRM_TIMEOUT = 5.0  # one attempt
CONFIRM_FIRST, CONFIRM_MAX = 0.05, 2.0  # backoff between attempts
# Create requests in flight to one worker at once. Creates concentrate on the few workers the
# policy ranks best at the moment; sent one request each, they made aiohttp open a connection more
# whenever those it held were busy (over TLS a handshake, 2-4 ms of the broker's CPU). Two let a
# create leave at once beside another; what comes meanwhile waits for one of them to be answered
# (a few milliseconds) and leaves with the others that waited, in one request.
CREATES_IN_FLIGHT = 2
# Connections placement holds to one worker: its creates' and a confirmation beside them. The
# broker's other calls to workers (waits, logs, exec, which may be long) have a client of their
# own, and never hold placement up.
CONNECTIONS_PER_WORKER = CREATES_IN_FLIGHT + 1
# How long a reservation on the bus may go unanswered before the HTTP path takes it: NATS says
# at once when no one listens; a worker that listens answers within its create's own wait.
BUS_TIMEOUT = 1.0


TAG_LENGTH = 4
BUSY = "busy"  # a create's reason when it waited out its time in its worker's lane, never sent


def placing_client(tls: NodeFiles | None = None) -> WorkerClient:
    """The worker client a broker's `Placer` reserves, confirms and asks for offers with."""
    return WorkerClient(tls=tls, per_worker=CONNECTIONS_PER_WORKER)


@functools.lru_cache(maxsize=100_000)
def worker_tag(worker: str) -> str:
    """A short tag naming the worker, at the end of the ids the broker gives machines: a broker
    whose catalog does not show a machine yet asks only the workers with its tag (see
    `Broker.find`). Not unique: a few workers may share one, and all of them are asked. Kept
    per worker: every create and every search of the fleet by tag asks for it."""
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


@dataclass
class _Waiting:
    """A create waiting in its worker's lane for the next request."""

    create: CreateMachine
    deadline: float  # monotonic: past it, its caller stops waiting (and it is not sent)
    answer: asyncio.Future[Machine]
    sent: bool = False


@dataclass
class _Lane:
    """One worker's creates: how many requests are out, and what waits for the next."""

    busy: int = 0
    waiting: list[_Waiting] = field(default_factory=list)


@dataclass
class _Confirming:
    """One worker's confirmations still to send: id -> when its hold ends (monotonic), those of
    them in a request now, and the task that sends them in requests of their own."""

    address: str
    due: dict[str, float] = field(default_factory=dict)
    sending: set[str] = field(default_factory=set)
    task: asyncio.Task[None] | None = None

    def take(self) -> list[str]:
        """Ids for one request (none already in one), now in it."""
        ids = list(
            itertools.islice((m for m in self.due if m not in self.sending), MAX_CONFIRMATIONS)
        )
        self.sending.update(ids)
        return ids

    def settle(self, worker: str, ids: list[str], holds: Mapping[str, str]) -> None:
        """The request carrying `ids` is over: those in `holds` are done with, the rest due
        again."""
        self.sending.difference_update(ids)
        for machine_id in ids:
            hold = holds.get(machine_id)
            if hold is None:
                continue
            self.due.pop(machine_id, None)
            if hold == "expired":
                log.error("%s on %s was confirmed after its hold ended", machine_id, worker)


def _time_out(answer: asyncio.Future[Machine]) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError())


class Reserver:
    """Reserves through one worker client, confirms what was answered, and keeps the cleanups
    of lost answers running. `hold`: seconds each create stays provisional on its worker."""

    def __init__(
        self,
        client: WorkerClient,
        liveness: Liveness | None = None,
        hold: float = HOLD_FOR,
        sent: Observer = OFF,
        bus: Bus | None = None,
        fell_back: Child = OFF,
    ) -> None:
        """`sent` observes the creates of each request sent; `bus`: reserve on it first;
        `fell_back` counts the requests it left unanswered, sent over HTTP."""
        self.client = client
        self.bus = bus
        self.bus_fallbacks = 0  # lane requests the bus left unanswered, sent over HTTP
        self.fell_back = fell_back
        self.liveness = liveness or Liveness()
        self.hold = hold
        self.sent = sent
        self._cleanups: set[asyncio.Task[None]] = set()
        self._confirming: dict[str, _Confirming] = {}
        self._lanes: dict[str, _Lane] = {}
        self._batches: set[asyncio.Task[None]] = set()
        self._closed = False  # stopping: what a cancelled request leaves is not sent

    async def reserve(
        self,
        cand: Candidate,
        create: CreateMachine,
        timeout: float,
        refusals: Noted,
        id_prefix: str | None = None,
    ) -> Machine | None:
        """The machine, or None with the worker's refusal added to `refusals`. A create that
        names its own id and finds it taken is the caller's conflict, not a refusal: raised. A
        keyed create (`id_prefix`) that finds its id taken is a retry that raced the first
        try: that machine is the answer."""
        new_id = create.id or new_machine_id(cand.worker, id_prefix)
        attempt = create.model_copy(update={"id": new_id})
        try:
            machine = await self._create(cand, attempt, timeout)
        except WorkerCallError as exc:
            refusals.append(Refusal(worker=cand.worker, reason=exc.message))
            if exc.http_status == 0 and exc.reason != BUSY:  # busy: never sent, nothing to undo
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

    async def _create(self, cand: Candidate, create: CreateMachine, timeout: float) -> Machine:
        """The worker's answer to this create: sent at once if its lane has room, else with the
        next batch the lane sends."""
        lane = self._lanes.get(cand.worker)
        if lane is None:
            lane = self._lanes[cand.worker] = _Lane()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Machine] = loop.create_future()
        waiting = _Waiting(create, time.monotonic() + timeout, answer)
        lane.waiting.append(waiting)
        self._dispatch(cand, lane)
        # Its own time, as alone: a batch lasts as long as its most patient create. A timer on
        # the future itself, not `wait_for`, which wraps it in a task and two callbacks more.
        timer = loop.call_later(timeout, _time_out, answer)
        try:
            return await answer
        except TimeoutError:
            if not waiting.sent:
                message = "still busy with earlier creates when this one's time ran out"
                raise WorkerCallError(cand.worker, 0, BUSY, message) from None
            message = f"no answer from {cand.address} within {timeout:.3g}s"
            raise WorkerCallError(cand.worker, 0, "timeout", message) from None
        finally:
            timer.cancel()

    def _dispatch(self, cand: Candidate, lane: _Lane) -> None:
        """Send what waits in the lane (its callers still waiting), as far as it has room, each
        request with the worker's confirmations due; once the lane is idle, the confirmations
        still due go on their own."""
        if self._closed:
            return
        confirming = self._confirming.get(cand.worker)
        while lane.busy < CREATES_IN_FLIGHT and lane.waiting:
            waiting = [w for w in lane.waiting if not w.answer.done()]
            batch, lane.waiting = waiting[:MAX_BATCH], waiting[MAX_BATCH:]
            if batch:
                lane.busy += 1
                ids = confirming.take() if confirming is not None else []
                task = asyncio.create_task(self._send(cand, lane, batch, ids))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)
        if lane.busy == 0 and not lane.waiting and self._lanes.get(cand.worker) is lane:
            del self._lanes[cand.worker]
            self._confirm_alone(cand.worker)

    async def _send(
        self, cand: Candidate, lane: _Lane, batch: list[_Waiting], ids: list[str]
    ) -> None:
        """One request for these creates, each answered as if it had gone alone, ending the
        holds of `ids` too. A create whose caller stopped waiting is not sent."""
        holds: dict[str, HoldAnswer] = {}
        try:
            now = time.monotonic()
            batch = [w for w in batch if not w.answer.done() and w.deadline > now]
            if not batch:
                return
            for waiting in batch:
                waiting.sent = True
            creates = [w.create for w in batch]
            timeout = max(w.deadline for w in batch) - now
            self.sent.observe(len(creates))
            try:
                answered = None
                if self.bus is not None:
                    answered = await self._over_bus(cand.worker, creates, timeout, ids)
                if answered is None:
                    answered = await self.client.create_batch(
                        cand.worker, cand.address, creates, timeout, hold=self.hold, confirm=ids
                    )
                results, holds = answered
            except WorkerCallError as exc:  # the request itself: every create of it shares the fate
                results = [exc] * len(batch)
            for waiting, result in zip(batch, results, strict=True):
                if waiting.answer.done():  # its caller gave up (the broker's client left)
                    continue
                if isinstance(result, WorkerCallError):
                    waiting.answer.set_exception(result)
                else:
                    waiting.answer.set_result(result)
        except Exception as exc:  # not the worker's answer: its callers raise it, as alone
            for waiting in batch:
                if not waiting.answer.done():
                    waiting.answer.set_exception(exc)
        finally:
            for waiting in batch:  # not answered: cancelled
                waiting.answer.cancel()
            confirming = self._confirming.get(cand.worker)
            if ids and confirming is not None:
                confirming.settle(cand.worker, ids, holds)
            lane.busy -= 1
            self._dispatch(cand, lane)

    async def _over_bus(
        self, worker: str, creates: list[CreateMachine], timeout: float, ids: list[str]
    ) -> tuple[list[Machine | WorkerCallError], dict[str, HoldAnswer]] | None:
        """The worker's answer to these creates on the bus, as `WorkerClient.create_batch` gives
        it over HTTP; None if none came in time (then HTTP: a request that did arrive makes its
        retry there `already_exists`, refused, and the machine ends with its hold)."""
        assert self.bus is not None
        batch = CreateBatch(machines=creates, confirm=ids or None)
        body = BusReservation(batch=batch, hold=self.hold)
        try:
            data = await self.bus.request(
                reserve_subject(worker), body.model_dump_json().encode(), min(timeout, BUS_TIMEOUT)
            )
        except TimeoutError:
            self.bus_fallbacks += 1
            self.fell_back.inc()
            log.info("no answer on the bus from %s: reserving over HTTP", worker)
            return None
        try:
            answer = CreateOutcomes.model_validate_json(data)
        except ValidationError:
            try:
                refused = BusRefusal.model_validate_json(data)
            except ValidationError:
                raise WorkerCallError(worker, 502, "invalid", "unreadable answer") from None
            raise WorkerCallError(worker, refused.status, *refusal_of(refused.error)) from None
        return outcomes_of(worker, answer, len(creates))

    async def _same(self, cand: Candidate, app: str, machine_id: str) -> Machine | None:
        try:
            machine = await self.client.machine(cand.worker, cand.address, machine_id)
        except WorkerCallError:
            return None
        return machine if machine.app == app else None

    def confirm(self, worker: str, address: str, machine_id: str) -> None:
        """The machine was answered to a client: end its hold on the worker. Sent in the
        background and retried until the hold would have ended anyway: while creates to the
        worker are out, with the next ones its lane sends, or on their own once it has none out
        (a few milliseconds); else at once, on their own, batched with the worker's other
        confirmations."""
        pending = self._confirming.get(worker)
        if pending is None:
            pending = self._confirming[worker] = _Confirming(address)
        pending.address = address or pending.address
        pending.due.setdefault(machine_id, time.monotonic() + self.hold)
        if worker not in self._lanes:  # no create out: none will take it along soon
            self._confirm_alone(worker)

    def _confirm_alone(self, worker: str) -> None:
        """Send the worker's confirmations still due in requests of their own, unless that is
        under way; forget a worker with none left."""
        pending = self._confirming.get(worker)
        if pending is None or (pending.task is not None and not pending.task.done()):
            return
        if pending.due:
            pending.task = asyncio.create_task(self._send_confirmations(worker, pending))
        else:
            del self._confirming[worker]

    async def _send_confirmations(self, worker: str, pending: _Confirming) -> None:
        delay = CONFIRM_FIRST
        while pending.due:
            now = time.monotonic()
            late = [m for m, until in pending.due.items() if until <= now]
            for machine_id in late:
                del pending.due[machine_id]
                log.error("could not confirm %s on %s: its hold has ended", machine_id, worker)
            ids = pending.take()
            if not ids:  # the rest ride with creates now on their way
                break
            holds: Mapping[str, str] = {}
            try:
                result = await self.client.confirm(
                    worker, pending.address, ids, timeout=CONFIRM_TIMEOUT
                )
                holds = result.holds
            except WorkerCallError as exc:
                if 0 < exc.http_status < 500:  # a worker that keeps no holds, say: give up
                    log.warning("%s refused confirmations: %s", worker, exc.message)
                    holds = dict.fromkeys(ids, "refused")
            finally:
                pending.settle(worker, ids, holds)
            if holds:
                delay = CONFIRM_FIRST
            else:
                await asyncio.sleep(delay)
                delay = min(delay * 2, CONFIRM_MAX)
        if self._confirming.get(worker) is pending and not pending.due:
            del self._confirming[worker]

    @property
    def confirmations_pending(self) -> int:
        return sum(len(p.due) for p in self._confirming.values())

    async def close(self) -> None:
        """Cancel the cleanups and confirmations still running (the broker is stopping)."""
        self._closed = True
        confirming = [p.task for p in self._confirming.values() if p.task is not None]
        tasks = [*self._cleanups, *confirming, *self._batches]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def pending(self) -> int:
        """Cleanups of lost answers still running."""
        return len(self._cleanups)

    def _cleanup(self, cand: Candidate, machine_id: str) -> None:
        async def destroy() -> None:
            # past the hold, the worker has destroyed an unconfirmed machine by itself
            end, delay = time.monotonic() + self.hold, CLEANUP_FIRST
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
                except WorkerCallError as exc:
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

"""Market placement, immediate or cancel: offers, ranking, reservation, all in one deadline.

1. The region's reachable, uncordoned workers that fit the guest by the catalog's picture.
2. Offers: `offers` asks every one of them at once: one message on the bus that every worker
   of the region hears (scatter-gather), or `POST /v1/offers` to each where there is no bus;
   `p2c` asks two sampled at random (Sparrow's power of two choices), two more if both fail,
   with one `POST /v1/offers` each: a message on the region's subject would cost every worker
   of the region a decode for the two that answer;
   `catalog` asks none and ranks the replicated picture, letting a worker's refusal correct it;
   in a region bigger than `sample` it ranks a random slice of that many workers at a time;
   `auto` (the default) is `offers` in a region of up to `offers_up_to` reachable workers and
   `catalog` beyond: an offer call costs every worker asked a decode and an answer per create,
   which a big region cannot afford (see docs/benchmarks.md).
3. Rank with the policy (`souk.broker.placement`).
4. Reserve on the best (`POST /v1/machines`); on refusal the next; until the deadline.
Then the machine, or `NoCapacity` with every worker's reason. Never a pending queue.

A reservation whose answer is lost (timeout, broken connection) may still have happened; its
machine id is the broker's, so the broker destroys that id on that worker in the background
before moving on, and the user never holds a machine they were not told about.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from souk.broker.fleet import Fleet
from souk.broker.placement import POLICIES, Candidate, Policy, rank
from souk.catalog.bus import Bus, Message
from souk.clients.workers import WorkerClient, WorkerError
from souk.models.api import Refusal, Strategy
from souk.models.capacity import Offer, OfferCall, OfferRequest, offers_subject
from souk.models.catalog import WorkerRow
from souk.models.machine import CreateMachine, GuestConfig, Machine

log = logging.getLogger("souk.broker")

DEFAULT_DEADLINE = 2.0
OFFER_TIMEOUT = 0.5  # an offer slower than this is a worker we would not want anyway
OFFERS_UP_TO = 32  # reachable workers up to which `auto` asks for offers
SAMPLE = 64  # workers of a big region the catalog strategy ranks per slice
MAX_CANDIDATES = 100_000  # workers whose candidate is kept between creates

DecisionHook = Callable[[Strategy, float], None]
"""Told the strategy taken (`auto` resolved) and the seconds from the start of `place()` to a
ranked list about to be reserved on (offers gathered and ranked): the decision time, which
benchmarks measure apart."""


@dataclass
class NoCapacity(Exception):
    region: str
    asked: int
    refusals: list[Refusal] = field(default_factory=list)

    def message(self) -> str:
        return (
            f"no worker in region {self.region} could take this machine"
            f" ({self.asked} workers asked)"
        )


def why_not(row: WorkerRow, guest: GuestConfig) -> str | None:
    """Why the catalog's picture says this worker cannot take the guest, or None if it can."""
    if row.cordoned:
        return "cordoned"
    if row.draining:
        return "draining"
    if guest.cpu_kind not in row.cpu_kinds:
        return f"no {guest.cpu_kind} cpus"
    if guest.cpus > row.cpus_free or guest.memory_mb > row.memory_mb_free:
        return f"not enough room: free {row.cpus_free} cpus, {row.memory_mb_free} MB"
    return None


def new_machine_id() -> str:
    return secrets.token_hex(7)


class Placer:
    def __init__(
        self,
        fleet: Fleet,
        client: WorkerClient,
        policy: Policy = POLICIES["default"],
        deadline: float = DEFAULT_DEADLINE,
        rng: random.Random | None = None,
        bus: Bus | None = None,
        on_decision: DecisionHook | None = None,
        offers_up_to: int = OFFERS_UP_TO,
        sample: int = SAMPLE,
    ) -> None:
        self.fleet = fleet
        self.offers_up_to = offers_up_to
        self.sample = sample
        self.on_decision = on_decision
        self.bus = bus
        self.client = client
        self.policy = policy
        self.deadline = deadline
        self.rng = rng or random.Random()
        self._cleanups: set[asyncio.Task[None]] = set()
        self._candidates: dict[str, tuple[WorkerRow, Candidate]] = {}

    async def place(
        self,
        region: str,
        create: CreateMachine,
        strategy: Strategy = "auto",
        policy: Policy | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> Machine:
        began, end = time.perf_counter(), time.monotonic() + self.deadline
        reachable = self.fleet.placeable(region)
        try:
            return await self._place(region, create, strategy, policy, avoid, reachable, began, end)
        except NoCapacity as exc:
            # The unreachable workers are looked up only to explain a refusal.
            known = {w.id for w in reachable}
            gone = [
                Refusal(worker=w.id, reason="unreachable")
                for w in self.fleet.workers(region=region, reachable_only=False)
                if w.id not in known
            ]
            exc.refusals[:0] = gone
            exc.asked += len(gone)
            raise

    async def _place(
        self,
        region: str,
        create: CreateMachine,
        strategy: Strategy,
        policy: Policy | None,
        avoid: frozenset[str],
        reachable: list[WorkerRow],
        began: float,
        end: float,
    ) -> Machine:
        guest = create.config.guest
        pol = policy or self.policy
        if strategy == "auto":
            strategy = "offers" if len(reachable) <= self.offers_up_to else "catalog"
        if strategy == "catalog":
            return await self._from_catalog(region, create, pol, avoid, reachable, began, end)
        rows, _, refusals = self.eligible(reachable, guest, avoid)
        asked = len(refusals)
        pool = list(rows)
        if strategy == "p2c":
            self.rng.shuffle(pool)
        while pool:
            batch, pool = (pool[:2], pool[2:]) if strategy == "p2c" else (pool, [])
            asked += len(batch)
            cands = await self._offers(
                batch, guest, create.config.image, refusals, end, strategy == "offers"
            )
            ranked = rank(cands, guest, pol, self.rng)
            self._decided(strategy, began, ranked)
            try:
                return await self._reserve(ranked, create, refusals, asked, end, region)
            except NoCapacity:
                if time.monotonic() >= end:
                    break
        raise NoCapacity(region, asked, refusals)

    async def _from_catalog(
        self,
        region: str,
        create: CreateMachine,
        policy: Policy,
        avoid: frozenset[str],
        reachable: list[WorkerRow],
        began: float,
        end: float,
    ) -> Machine:
        """Ranks the catalog's picture a random slice of `sample` workers at a time (Borg's
        relaxed randomization): the best of a few dozen workers that fit is a good worker, and
        ranking a whole region for every create is what would make the decision grow with the
        region. A create that names an image ranks them all: the workers caching it must be
        seen. If every worker of a slice refuses, the next slice, within the deadline."""
        guest, image = create.config.guest, create.config.image
        size = max(1, self.sample if image is None else len(reachable))
        start = self.rng.randrange(len(reachable)) if reachable else 0
        order = reachable[start:] + reachable[:start]
        refusals: list[Refusal] = []
        asked = 0
        for i in range(0, len(order), size):
            _, cands, refused = self.eligible(order[i : i + size], guest, avoid)
            refusals += refused
            asked += len(refused) + len(cands)
            if image is not None:
                cached = self.fleet.image_cached
                cands = [
                    replace(c, image_cached=True) if cached(c.worker, image) else c for c in cands
                ]
            ranked = rank(cands, guest, policy, self.rng)
            if not ranked:
                continue
            self._decided("catalog", began, ranked)
            try:
                return await self._reserve(ranked, create, refusals, asked, end, region)
            except NoCapacity:
                if time.monotonic() >= end:
                    break
        raise NoCapacity(region, asked, refusals)

    def eligible(
        self, reachable: list[WorkerRow], guest: GuestConfig, avoid: frozenset[str] = frozenset()
    ) -> tuple[list[WorkerRow], list[Candidate], list[Refusal]]:
        """The workers that fit the guest by the catalog's picture, as rows and as candidates
        (in the same order), and why each of the others does not."""
        rows: list[WorkerRow] = []
        cands: list[Candidate] = []
        refusals: list[Refusal] = []
        for row in reachable:
            cand = self._candidate(row)
            if cand.fits(guest) and not (row.cordoned or row.draining or row.id in avoid):
                rows.append(row)
                cands.append(cand)
            else:
                reason = why_not(row, guest) or "avoided by the request (avoid_workers)"
                refusals.append(Refusal(worker=row.id, reason=reason))
        return rows, cands, refusals

    def _candidate(self, row: WorkerRow) -> Candidate:
        """The row as placement sees it, built once per version of the row: a catalog hands out
        the same row object until its owner changes it, and at a thousand workers building the
        candidates anew for every create would cost more than ranking them."""
        held = self._candidates.get(row.id)
        if held is None or held[0] is not row:
            if len(self._candidates) >= MAX_CANDIDATES:
                self._candidates.clear()
            held = self._candidates[row.id] = (row, Candidate.from_row(row))
        return held[1]

    def _decided(
        self, strategy: Strategy, began: float, ranked: list[tuple[float, Candidate]]
    ) -> None:
        if self.on_decision is not None and ranked:
            self.on_decision(strategy, time.perf_counter() - began)

    async def _offers(
        self,
        rows: list[WorkerRow],
        guest: GuestConfig,
        image: str | None,
        refusals: list[Refusal],
        end: float,
        scatter: bool,
    ) -> list[Candidate]:
        timeout = min(OFFER_TIMEOUT, end - time.monotonic())
        req = OfferRequest(guest=guest, image=image)
        results: list[Offer | BaseException]
        if scatter and self.bus is not None:
            results = await self._gather(self.bus, rows, req, timeout)
        else:
            results = await asyncio.gather(
                *(self.client.offer(r.id, r.address, req, timeout) for r in rows),
                return_exceptions=True,
            )
        cands = []
        for row, result in zip(rows, results, strict=True):
            if isinstance(result, WorkerError):
                refusals.append(Refusal(worker=row.id, reason=f"no offer: {result.message}"))
            elif isinstance(result, BaseException):
                refusals.append(Refusal(worker=row.id, reason=f"no offer: {result!r}"))
            elif not result.fits:
                free = result.capacity.free
                reason = (
                    "cordoned"
                    if result.capacity.cordoned
                    else f"does not fit: free {free.cpus} cpus, {free.memory_mb} MB"
                )
                refusals.append(Refusal(worker=row.id, reason=reason))
            else:
                cands.append(
                    Candidate.from_capacity(result.capacity, row.address, result.image_cached)
                )
        return cands

    async def _gather(
        self, bus: Bus, rows: list[WorkerRow], req: OfferRequest, timeout: float
    ) -> list[Offer | BaseException]:
        """One call on the region's subject; the named workers answer to one inbox."""
        if not rows:
            return []
        wanted = {r.id for r in rows}
        offers: dict[str, Offer] = {}
        done = asyncio.Event()

        async def on_offer(msg: Message) -> None:
            try:
                offer = Offer.model_validate_json(msg.data)
            except ValueError:
                return
            if offer.capacity.worker in wanted:
                offers[offer.capacity.worker] = offer
                if len(offers) == len(wanted):
                    done.set()

        inbox = bus.new_inbox()
        sub = await bus.subscribe(inbox, on_offer)
        try:
            call = OfferCall(request=req, workers=sorted(wanted))
            await bus.publish(
                offers_subject(rows[0].region), call.model_dump_json().encode(), reply=inbox
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout)
        finally:
            await sub.unsubscribe()
        late = WorkerError("", 0, "timeout", f"no offer within {timeout:.2f}s")
        return [offers.get(r.id, late) for r in rows]

    async def _reserve(
        self,
        ranked: list[tuple[float, Candidate]],
        create: CreateMachine,
        refusals: list[Refusal],
        asked: int,
        end: float,
        region: str,
    ) -> Machine:
        for _, cand in ranked:
            remaining = end - time.monotonic()
            if remaining <= 0:
                refusals.append(Refusal(worker=cand.worker, reason="deadline passed"))
                break
            attempt = create.model_copy(update={"id": create.id or new_machine_id()})
            try:
                return await self.client.create(cand.worker, cand.address, attempt, remaining)
            except WorkerError as exc:
                refusals.append(Refusal(worker=cand.worker, reason=exc.message))
                if exc.http_status == 0:
                    self._cleanup(cand, attempt.id or "")
                elif exc.http_status == 409 and exc.reason == "already_exists" and create.id:
                    raise
        raise NoCapacity(region, asked, refusals)

    def _cleanup(self, cand: Candidate, machine_id: str) -> None:
        async def destroy() -> None:
            try:
                await self.client.request(
                    cand.worker,
                    cand.address,
                    "DELETE",
                    f"/v1/machines/{machine_id}",
                    params={"force": "true"},
                    timeout=30,
                )
            except WorkerError as exc:
                if exc.http_status != 404:
                    log.warning("could not clean up %s on %s: %s", machine_id, cand.worker, exc)

        task = asyncio.create_task(destroy())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    def stats(self) -> dict[str, Any]:
        return {"cleanups_pending": len(self._cleanups)}

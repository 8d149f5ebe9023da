"""Market placement, immediate or cancel, as a pipeline within one deadline:

    candidates -> feasible -> ranked -> picked -> reserved

1. candidates (`stages.candidates`): the region's reachable workers as the catalog shows them,
   a slice at a time: the whole region for `offers` and `p2c`, slices of `sample` rows from a
   random start for `catalog`.
2. feasible (`stages.feasible`, then `offers`): first by the catalog's picture (cordon, drain,
   cpu kind, room, `avoid_workers`), then, for `offers` and `p2c`, by the workers' own offers:
   `offers` asks them all at once, `p2c` two at random and two more if neither takes it.
3. ranked (`stages.rank`): the policy's score (`policies`), ties broken at random.
4. picked (`stages.picked`): best first, while the deadline leaves time.
5. reserved (`reservation.Reserver`): `POST /v1/machines` on the worker; on refusal the next
   pick, then the next offer round or slice. The machine, or `NoCapacity` with every worker's
   reason. Never a pending queue.

Why this order: each stage costs more per worker than the one before it, so each runs on what
the cheaper ones left. Reading rows and checking fit happen in memory, in microseconds, and drop
every worker that cannot take the machine before anyone is asked or scored. An offer costs a
round trip, and every worker asked a decode and an answer, so only workers that fit by the
picture are asked. A reservation is the one step with a final answer and the one that changes
anything, so it comes last and goes to one worker at a time.

The slice bounds a create's work in a big region (the best of a few dozen workers that fit is
a good worker, as in Borg's relaxed randomization and Nomad's shuffled, limited source), so the
decision stops growing with the region; its random start, which each placer keeps for a second
(`slice_start`), has brokers looking at the same picture start from different workers instead
of racing for one, and one broker's consecutive creates meet on the same worker.

Offers or catalog: an offer is fresh but costs every worker asked, per create; the catalog is
free to read but may be milliseconds stale, and a worker's refusal at reservation corrects it.
`auto` (the default) takes `offers` in a region of up to `offers_up_to` reachable workers and
`catalog` beyond, which a big region needs (see docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from souk.broker.fleet import Fleet
from souk.broker.liveness import BusLink, Link, Liveness
from souk.broker.metrics import BrokerMetrics
from souk.broker.placement import offers
from souk.broker.placement.candidates import Candidate, CandidateCache
from souk.broker.placement.journal import Decision, Journal
from souk.broker.placement.pending import PendingRoom
from souk.broker.placement.policies import POLICIES, Policy
from souk.broker.placement.reservation import Reserver
from souk.broker.placement.stages import (
    Feasible,
    Ranked,
    Refusals,
    Scores,
    candidates,
    feasible,
    offer_rounds,
    picked,
    rank,
    with_cached_image,
)
from souk.catalog.bus import Bus
from souk.clients.workers import WorkerCallError, WorkerClient
from souk.models.api import Refusal, Strategy
from souk.models.capacity import OfferRequest
from souk.models.catalog import WorkerRow
from souk.models.guest import GuestConfig
from souk.models.machine import CreateMachine, Machine

DEFAULT_DEADLINE = 2.0
RESERVE_SHARE = 0.5  # of the deadline, at most, for one reservation that is not the last
REGION_EVERY = 1.0  # seconds between two reads of a region's silent workers
OFFERS_UP_TO = 32  # reachable workers up to which `auto` asks for offers
SAMPLE = 64  # workers of a big region the catalog strategy ranks per slice
# How long a placer keeps the slice of a region it starts from (see `Placer.slice_start`).
STICKY_FOR = 1.0

DecisionHook = Callable[[Strategy, float], None]
"""Told the strategy taken (`auto` resolved) and the seconds from the start of `place()` to a
ranked list about to be reserved on (offers gathered and ranked): the decision time, which
benchmarks measure apart."""


@dataclass
class NoCapacity(Exception):
    """Nothing took the machine: filled in as the pipeline goes, raised at its end."""

    region: str
    asked: int
    refusals: Refusals = field(default_factory=Refusals)

    def message(self) -> str:
        where = f"region {self.region}" if self.region else "any region"
        return f"no worker in {where} could take this machine ({self.asked} workers asked)"


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
        metrics: BrokerMetrics | None = None,
        reserve_over_bus: bool = False,
    ) -> None:
        """`reserve_over_bus`: reservations go on `bus` first (`Reserver`), HTTP after."""
        self.fleet = fleet
        self.client = client
        self.policy = policy
        self.deadline = deadline
        self.rng = rng or random.Random()
        self.bus = bus
        self.on_decision = on_decision
        self.offers_up_to = offers_up_to
        self.sample = sample
        self.metrics = metrics or BrokerMetrics()
        self.cache = CandidateCache()
        self.pending = PendingRoom(self.cache.row)
        self.scores = Scores()
        self.liveness = Liveness()
        self.link: Link | None = BusLink(bus) if bus is not None else None
        self.reserver = Reserver(
            client,
            self.liveness,
            sent=self.metrics.reservation_creates,
            bus=bus if reserve_over_bus else None,
            fell_back=self.metrics.bus_fallbacks,
        )
        self._regions: dict[str, tuple[float, int, list[WorkerRow]]] = {}
        self._starts: dict[str | None, tuple[int, float]] = {}  # see `slice_start`
        self.journal = Journal()  # the last creates' decisions, to explain them

    async def place(
        self,
        region: str | None,
        create: CreateMachine,
        strategy: Strategy = "auto",
        policy: Policy | None = None,
        avoid: frozenset[str] = frozenset(),
        id_prefix: str | None = None,
    ) -> Machine:
        """`id_prefix`: the machine's id is this and the chosen worker's tag (a create with an
        idempotency key), instead of random digits and the tag. `region` None: every region's
        workers are candidates at once, so the best offer of the cluster wins, wherever it is
        (for clients that name no region)."""
        began, end = time.perf_counter(), time.monotonic() + self.deadline
        reachable, doubtful = self.usable_in(region)
        if strategy == "auto":
            strategy = "offers" if len(reachable) <= self.offers_up_to else "catalog"
        refused = NoCapacity(region or "", 0)
        guest, chosen = create.config.guest, policy or self.policy
        feasible_rounds = self._feasible(
            region, reachable, doubtful, strategy, create, avoid, end, refused
        )
        share = self.deadline * RESERVE_SHARE
        decided: list[Ranked] = []  # kept by reference for the journal, never copied
        async with contextlib.aclosing(feasible_rounds) as rounds:  # 1. candidates, 2. feasible
            async for cands in rounds:
                # 3. ranked: as each worker will be once what this broker is reserving there
                # lands (`pending`); those with room only by what they show come last
                first, later = self.pending.split(cands, guest, offered=strategy != "catalog")
                ranked = rank(first, guest, chosen, self.rng, self.scores)
                if later:
                    ranked += rank(later, guest, chosen, self.rng, self.scores)
                self._decided(strategy, began, ranked)
                decided.append(ranked)
                last = ranked[-1][1] if ranked else None
                for cand, remaining in picked(ranked, end, refused.refusals):  # 4. picked
                    # One worker that does not answer may spend a share of the deadline, not
                    # all of it; the last one may spend what is left.
                    timeout = remaining if cand is last else min(remaining, share)
                    reservation = self.pending.reserving(cand.worker, guest)
                    machine = None
                    try:
                        machine = await self.reserver.reserve(  # 5. reserved
                            cand, create, timeout, refused.refusals, id_prefix
                        )
                    finally:
                        self.pending.ended(reservation, taken=machine is not None)
                    if machine is not None:
                        self.metrics.placed[strategy].observe(time.perf_counter() - began)
                        self.journal.record(
                            Decision(
                                machine.id,
                                create.app,
                                machine.region,
                                strategy,
                                chosen,
                                guest,
                                decided,
                                refused.refusals,
                                machine.worker,
                                time.time(),
                                time.perf_counter() - began,
                            )
                        )
                        return machine
                if time.monotonic() >= end:
                    break
        self._unreachable(region, doubtful, refused)
        self.metrics.refused(strategy, time.perf_counter() - began, refused.refusals.reasons())
        raise refused

    def regions(self) -> list[str]:
        """Every region the catalog knows a worker in, reachable or not."""
        return self.fleet.worker_regions()

    def usable_in(self, region: str | None) -> tuple[list[WorkerRow], set[str]]:
        """`usable` of one region, or of every region together."""
        if region is not None:
            return self.usable(region)
        rows: list[WorkerRow] = []
        doubtful: set[str] = set()
        for name in self.regions():
            more, unsure = self.usable(name)
            rows += more
            doubtful |= unsure
        return rows, doubtful

    def usable(self, region: str) -> tuple[list[WorkerRow], set[str]]:
        """The region's workers placement may use (see `souk.broker.liveness`), and which of
        them are doubtful: silent on the bus, so asked over HTTP. The fast path is the
        catalog's reachable rows as held; the region's silent rows are read when that count
        changes, else at most once per `REGION_EVERY` seconds. Workers shunned for a failed
        call stay in the held rows and are left out a slice at a time (`_feasible`): taking
        them out here copied the region on every create while any worker was shunned, 6 ms at
        10,000 workers."""
        rows = self.fleet.placeable(region)
        now_m = time.monotonic()
        cached = self._regions.get(region)
        if cached is None or now_m - cached[0] > REGION_EVERY or cached[1] != len(rows):
            silent = self.fleet.silent(region)
            known = {w.id for w in rows} if silent else set()
            silent = [w for w in silent if w.id not in known]
            cached = self._regions[region] = (now_m, len(rows), silent)
        if not cached[2]:
            return rows, set()
        now, shunned = time.time(), self.liveness.shunned
        doubtful = [w for w in cached[2] if not shunned(w.id) and self.liveness.fresh(w, now)]
        if not doubtful:
            return rows, set()
        return [*rows, *doubtful], {w.id for w in doubtful}

    def slice_start(self, region: str | None, n: int) -> int:
        """Where the catalog strategy starts in a region of `n` rows: drawn at random, then
        kept for `STICKY_FOR` seconds, and moved on to a later slice when one had no room.

        Kept, because consecutive creates that rank the same slice favour the same worker
        (the policy scores a worker it just filled higher, up to the curve's peak), so they
        meet in its lane and reach it as one request and one commit, and their confirmations
        ride along: in a region of 1,000 workers a fresh random slice per create sent almost
        every create, and a third of the confirmations, in requests of their own
        (docs/benchmarks.md). Brokers still draw their own starts, so two brokers rarely rank
        the same slice."""
        held = self._starts.get(region)
        if held is None or time.monotonic() >= held[1]:
            return self._keep_start(region, self.rng.randrange(max(n, 1)))
        return held[0]

    def _keep_start(self, region: str | None, start: int) -> int:
        self._starts[region] = (start, time.monotonic() + STICKY_FOR)
        return start

    def holding(self, region: str | None, image: str) -> list[WorkerRow]:
        """The placeable workers (of the region, or of every region) that hold the image: by
        the reference it was pulled as, or, for one pinned (`name:tag@sha256:...`, as a deploy
        sends it), by that digest too (a worker that pulled the tag holds it under the digest)."""
        regions = [region] if region is not None else self.regions()
        digest = image.partition("@")[2]
        keys = [image, digest] if digest else [image]
        rows = [
            r for name in regions for key in keys for r in self.fleet.placeable_holding(name, key)
        ]
        return list({r.id: r for r in rows}.values()) if digest else rows

    async def _feasible(
        self,
        region: str | None,
        reachable: list[WorkerRow],
        doubtful: set[str],
        strategy: Strategy,
        create: CreateMachine,
        avoid: frozenset[str],
        end: float,
        refused: NoCapacity,
    ) -> AsyncGenerator[list[Candidate], None]:
        """Stages 1 and 2: the feasible candidates, a round at a time, each round asked for
        only once the one before it has been tried; every worker looked at counts as asked."""
        guest, image = create.config.guest, create.config.image
        shunned = self.liveness.shunned if self.liveness.any_shunned else None
        start = holding = None
        if strategy == "catalog":
            start = self.slice_start(region, len(reachable))
            holding = self.holding(region, image) if image else None
        holders = {row.id for row in holding} if holding else set()
        slices = candidates(reachable, strategy, self.sample, self.rng, start, holding)
        for i, rows in enumerate(slices):
            if i and start is not None:  # the slice before had no room: start from here
                self._keep_start(region, start + i * max(1, self.sample))
            if shunned is not None:
                rows = [w for w in rows if not shunned(w.id)]
            fit = self.eligible(rows, guest, avoid)
            refused.refusals.add(fit.refusals)
            refused.asked += len(fit.refusals)
            if strategy == "catalog":
                refused.asked += len(fit.candidates)
                yield with_cached_image(fit.candidates, holders)
                continue
            for asked in offer_rounds(fit.rows, strategy, self.rng):
                refused.asked += len(asked)
                yield await self._offers(
                    asked, doubtful, guest, image, end, strategy, refused.refusals
                )

    def eligible(
        self, rows: list[WorkerRow], guest: GuestConfig, avoid: frozenset[str] = frozenset()
    ) -> Feasible:
        """The feasible stage by the catalog's picture, with this placer's candidate cache: a
        method of its own so that a benchmark can time it apart."""
        return feasible(rows, guest, avoid, self.cache)

    async def _offers(
        self,
        rows: list[WorkerRow],
        doubtful: set[str],
        guest: GuestConfig,
        image: str | None,
        end: float,
        strategy: Strategy,
        refusals: Refusals,
    ) -> list[Candidate]:
        """The feasible stage by the workers' own offers. `p2c` asks over HTTP even with a bus:
        a message on the region's subject would cost every worker of the region a decode for
        the two that answer. So do workers silent on the bus, every worker while the broker's
        own bus link is down, and any worker whose offer did not come over the bus in time
        (its subscription may be gone while it reconnects): the broker reaches them directly."""
        timeout = min(offers.OFFER_TIMEOUT, end - time.monotonic())
        req = OfferRequest(guest=guest, image=image)
        bus_up = self.bus is not None and self.link is not None and self.link.up
        answers: dict[str, offers.Answer] = {}
        over_bus = [r for r in rows if r.id not in doubtful] if bus_up else []
        if self.bus is not None and strategy == "offers" and over_bus:
            heard = await offers.gather(self.bus, over_bus, req, timeout)
            for row, answer in zip(over_bus, heard, strict=True):
                if not isinstance(answer, BaseException):
                    answers[row.id] = answer
            timeout = min(offers.OFFER_TIMEOUT, end - time.monotonic())
        direct = [r for r in rows if r.id not in answers]
        if direct and timeout > 0:
            got = await offers.ask(self.client, None, direct, req, timeout)
            for row, answer in zip(direct, got, strict=True):
                answers[row.id] = answer
                if isinstance(answer, WorkerCallError) and answer.http_status == 0:
                    self.liveness.failed(row.id)
                elif not isinstance(answer, BaseException):
                    self.liveness.answered(row.id)
        late = WorkerCallError("", 0, "timeout", "no time left to ask")
        ordered = [answers.get(r.id, late) for r in rows]
        declined: list[Refusal] = []
        cands = offers.offered(rows, ordered, guest, declined)
        offered = sum(1 for a in ordered if not isinstance(a, BaseException))
        self.metrics.offers(strategy, len(rows), offered, declined)
        refusals.extend(declined)
        return cands

    def _decided(self, strategy: Strategy, began: float, ranked: Ranked) -> None:
        if ranked:
            took = time.perf_counter() - began
            self.metrics.decision[strategy].observe(took)
            if self.on_decision is not None:
                self.on_decision(strategy, took)

    def _unreachable(self, region: str | None, doubtful: set[str], refused: NoCapacity) -> None:
        """The region's unreachable workers, first among the refusals: those silent on the bus
        and not asked over HTTP, and those shunned for a failed call. Looked up only to explain
        a refusal, placement never reads them, and from the silent rows and the shunned ids
        alone: copying every row of the region instead cost a refusal 30 ms at 10,000 workers,
        which a client asking for a size no worker has could repeat at will."""
        regions = [region] if region is not None else self.regions()
        gone = {w.id for name in regions for w in self.fleet.silent(name) if w.id not in doubtful}
        for worker in self.liveness.shunned_now():
            row = self.fleet.worker(worker)
            if row is not None and (region is None or row.region == region):
                gone.add(worker)
        refused.refusals.prepend([Refusal(worker=w, reason="unreachable") for w in sorted(gone)])
        refused.asked += len(gone)

    def stats(self) -> dict[str, Any]:
        return {"cleanups_pending": self.reserver.pending}

"""The stages of placement that need no I/O, each a plain function (see `pipeline` for their
order and why): which rows to look at, which of them fit, their ranking, the picks in order.

They take everything they use as arguments, the random source included, so each is tested on
its own and a seeded `random.Random` replays a decision exactly.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import replace
from operator import itemgetter
from typing import NamedTuple, Protocol, overload

from souk.broker.placement.candidates import Candidate, CandidateCache, misfit_in
from souk.broker.placement.policies import POLICIES, REFUSE, Policy
from souk.models.api import Refusal, Strategy
from souk.models.catalog import WorkerRow
from souk.models.guest import GuestConfig

AVOIDED = "avoided by the request (avoid_workers)"
DEADLINE_PASSED = "deadline passed"
TIE_JITTER = 1e-9
SIZES_KEPT = 64  # guest sizes (and policies) whose scores `Scores` keeps at once
_rng = random.Random()

Ranked = list[tuple[float, Candidate]]


def candidates(
    reachable: list[WorkerRow],
    strategy: Strategy,
    sample: int,
    rng: random.Random,
    start: int | None = None,
    holding: list[WorkerRow] | None = None,
) -> Iterator[list[WorkerRow]]:
    """The region's rows, a slice at a time. `offers` and `p2c` take the whole region in one
    slice: they ask workers anyway, and whom is for `offer_rounds` to say. `catalog` takes
    slices of `sample` rows from `start` on (drawn from `rng` when None; Borg's relaxed
    randomization): the best of a few dozen workers that fit is a good worker, and ranking a
    whole region for every create is what would make the decision grow with the region; a
    random start spreads brokers that see the same picture over different slices. The workers
    `holding` a create's image join its first slice, wherever they are in the region: they
    must be seen (and are ranked once)."""
    if strategy != "catalog":
        yield reachable
        return
    if holding:
        yield from _with_holders(candidates(reachable, strategy, sample, rng, start), holding)
        return
    n = len(reachable)
    size = max(1, sample)
    if not reachable:
        start = 0
    elif start is None:
        start = rng.randrange(n)
    else:
        start %= n
    for a in range(start, start + n, size):  # the region turned at `start`, never copied whole
        b = min(a + size, start + n)
        if b <= n:
            yield reachable[a:b]
        elif a >= n:
            yield reachable[a - n : b - n]
        else:
            yield reachable[a:] + reachable[: b - n]


def _with_holders(
    slices: Iterator[list[WorkerRow]], holding: list[WorkerRow]
) -> Iterator[list[WorkerRow]]:
    held = {row.id for row in holding}
    for i, rows in enumerate(slices):
        others = [row for row in rows if row.id not in held]
        yield [*holding, *others] if i == 0 else others


class Noted(Protocol):
    """Where a stage adds the refusals it finds: a list, or a create's `Refusals`."""

    def append(self, refusal: Refusal, /) -> None: ...


class Misfits(Sequence[Refusal]):
    """The rows of a slice that the guest does not fit, or that the request avoids, with what
    says why; each `Refusal` is built only when read. A slice at 60% full refuses dozens of
    workers per create, and a create's refusals are read only to explain it (a 412, or the
    journal asked later): building them all, reason strings and models, cost more than the
    rest of the feasible stage. What says why is the candidate and the row's cordon and drain
    as they were (both immutable), so a reason built later is the one the stage would have
    given; `None` for a worker avoided by the request."""

    __slots__ = ("_built", "found", "guest")

    def __init__(self, guest: GuestConfig) -> None:
        self.guest = guest
        self.found: list[tuple[str, Candidate | None, bool, bool]] = []
        self._built: list[Refusal] | None = None

    def built(self) -> list[Refusal]:
        if self._built is None or len(self._built) != len(self.found):
            self._built = [self._refusal(*f) for f in self.found]
        return self._built

    def _refusal(
        self, worker: str, cand: Candidate | None, cordoned: bool, draining: bool
    ) -> Refusal:
        return Refusal(worker=worker, reason=self._reason(cand, cordoned, draining))

    def _reason(self, cand: Candidate | None, cordoned: bool, draining: bool) -> str:
        if cand is None:
            return AVOIDED
        why = misfit_in(cand, self.guest, cordoned, draining)
        assert why is not None, "kept as a misfit by the rule, so the rule says why"
        return why.reason

    def __len__(self) -> int:
        return len(self.found)

    @overload
    def __getitem__(self, i: int) -> Refusal: ...

    @overload
    def __getitem__(self, i: slice) -> list[Refusal]: ...

    def __getitem__(self, i: int | slice) -> Refusal | list[Refusal]:
        return self.built()[i]

    def __iter__(self) -> Iterator[Refusal]:
        """Built one at a time as read, so that reading the first few of a region's thousands
        (a 412's answer) builds only those."""
        if self._built is not None and len(self._built) == len(self.found):
            return iter(self._built)
        return (self._refusal(*f) for f in self.found)

    def reasons(self) -> Iterator[str]:
        """Each refusal's reason, without building the refusals (the no-capacity metrics)."""
        return (
            self._reason(cand, cordoned, draining) for _, cand, cordoned, draining in self.found
        )


class Refusals:
    """Why each worker did not take a create, in the order the stages found them: refusals
    built as they came, and whole slices' `Misfits`, built only when read (a 412's answer, the
    no-capacity metrics, an explanation)."""

    __slots__ = ("_parts",)

    def __init__(self, refusals: Iterable[Refusal] = ()) -> None:
        self._parts: list[Refusal | Misfits] = list(refusals)

    def append(self, refusal: Refusal, /) -> None:
        self._parts.append(refusal)

    def extend(self, refusals: Iterable[Refusal]) -> None:
        self._parts.extend(refusals)

    def add(self, misfits: Misfits) -> None:
        if misfits.found:
            self._parts.append(misfits)

    def prepend(self, refusals: list[Refusal]) -> None:
        self._parts[:0] = refusals

    def __len__(self) -> int:
        return sum(len(p) if type(p) is Misfits else 1 for p in self._parts)

    def __iter__(self) -> Iterator[Refusal]:
        for part in self._parts:
            if type(part) is Misfits:
                yield from part
            else:
                assert isinstance(part, Refusal)
                yield part

    def reasons(self) -> Iterator[str]:
        for part in self._parts:
            if type(part) is Misfits:
                yield from part.reasons()
            else:
                assert isinstance(part, Refusal)
                yield part.reason


class Feasible(NamedTuple):
    """The rows that fit, as rows and as candidates (in the same order), and why the others
    do not (built when read)."""

    rows: list[WorkerRow]
    candidates: list[Candidate]
    refusals: Misfits


def feasible(
    rows: Iterable[WorkerRow],
    guest: GuestConfig,
    avoid: frozenset[str],
    cache: CandidateCache,
) -> Feasible:
    """The workers that fit the guest by the catalog's picture, by the worker's own rule
    (`souk.models.fit.misfit`: cordon, drain, cpu kind, room), minus those the request avoids.
    The guest's fields are read once, not per row: this runs for every row of a slice."""
    kind, cpus, memory_mb = guest.cpu_kind, guest.cpus, guest.memory_mb
    out = Feasible([], [], Misfits(guest))
    fit_rows, fit_cands, refused = out.rows.append, out.candidates.append, out.refusals.found.append
    held = cache.held  # looked up here, not through a call: this loop is most of a decision
    for row in rows:
        known = held.get(row.id)
        cand = known[1] if known is not None and known[0] is row else cache(row)
        # `misfit` is the rule and names the reason (`Misfits` asks it when a refusal is read);
        # these are its comparisons inline (a property test holds the two to one answer).
        if (
            cpus <= cand.cpus_free
            and memory_mb <= cand.memory_mb_free
            and kind in cand.cpu_kinds
            and not row.cordoned
            and not row.draining
        ):
            if row.id in avoid:
                refused((row.id, None, False, False))
            else:
                fit_rows(row)
                fit_cands(cand)
        else:
            refused((row.id, cand, row.cordoned, row.draining))
    return out


def offer_rounds(
    rows: list[WorkerRow], strategy: Strategy, rng: random.Random
) -> Iterator[list[WorkerRow]]:
    """Whom to ask for offers, a round at a time: `offers` asks them all at once; `p2c` asks
    two sampled at random, then two more if neither takes the machine (Sparrow's power of two
    choices)."""
    if not rows:
        return
    if strategy != "p2c":
        yield rows
        return
    pool = list(rows)
    rng.shuffle(pool)
    for i in range(0, len(pool), 2):
        yield pool[i : i + 2]


def with_cached_image(cands: list[Candidate], holders: Collection[str]) -> list[Candidate]:
    """The candidates, marked where the catalog says the image is already there (`holders`;
    an offer says so itself)."""
    if not holders:
        return cands
    return [replace(c, image_cached=True) if c.worker in holders else c for c in cands]


def rank(
    candidates: Iterable[Candidate],
    guest: GuestConfig,
    policy: Policy = POLICIES["default"],
    rng: random.Random | None = None,
    scores: Scores | None = None,
) -> Ranked:
    """Candidates the policy accepts, best first, with their scores. Each score carries a jitter
    below 1e-9 so equal scores come out in random order: brokers ranking the same picture then
    do not all race for the same worker. `scores`: where scores of earlier creates are kept."""
    draw = (rng or _rng).random
    scored: Ranked = []
    append = scored.append
    if scores is None:
        for c in candidates:
            s = policy(c, guest)
            if s > REFUSE:
                append((s + draw() * TIE_JITTER, c))
    else:
        kept = scores.table(policy, guest)
        get = kept.get
        for c in candidates:
            known = get(id(c))
            if known is not None and known[0] is c:
                s = known[1]
            else:
                s = policy(c, guest)
                kept[id(c)] = (c, s)
            if s > REFUSE:
                append((s + draw() * TIE_JITTER, c))
    scored.sort(key=_SCORE, reverse=True)
    return scored


class Scores:
    """Each candidate's score for a guest's size, kept with the candidate it was computed for.
    A row's candidate is the same object until the row, or a hold on the worker, changes
    (`CandidateCache`), so between two creates of one size only the worker the last one filled
    is scored again. A policy is a pure function of the candidate and the guest's size, as
    `Policy` says. Kept by object (the entry holds the object, so its id is not reused while
    kept); a table that grows past `limit` (stale candidates) starts again."""

    __slots__ = ("_tables", "limit")

    def __init__(self, limit: int = 50_000) -> None:
        self.limit = limit
        self._tables: dict[tuple[object, ...], dict[int, tuple[Candidate, float]]] = {}

    def table(self, policy: Policy, guest: GuestConfig) -> dict[int, tuple[Candidate, float]]:
        key = (policy, guest.cpu_kind, guest.cpus, guest.memory_mb, guest.gpus, guest.gpu_kind)
        kept = self._tables.get(key)
        if kept is None or len(kept) > self.limit:
            if kept is None and len(self._tables) >= SIZES_KEPT:
                self._tables.clear()
            kept = self._tables[key] = {}
        return kept


_SCORE = itemgetter(0)


def picked(ranked: Ranked, end: float, refusals: Noted) -> Iterator[tuple[Candidate, float]]:
    """The ranked candidates best first, each with the seconds left to reserve on it, read as
    each is taken (a reservation in between spends them). At the deadline, a refusal for the
    one not tried and no more."""
    for _, cand in ranked:
        remaining = end - time.monotonic()
        if remaining <= 0:
            refusals.append(Refusal(worker=cand.worker, reason=DEADLINE_PASSED))
            return
        yield cand, remaining

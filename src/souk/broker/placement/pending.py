"""The room a broker has spent on a worker that neither the catalog nor an offer shows yet: the
creates on their way to it, and those it took until a newer row of it comes.

Without it, the creates of one deploy, arriving together, each rank the same picture before any
of them has reserved: all pick the same worker, it takes what fits and refuses the rest, and the
refused ones all move to the same next pick (docs/study.md, "a deploy should not herd"). Ranked
with it, the deploy's later creates see each worker as it will be and go to the next one first.

It changes the order only, never the answer: a worker that has room by its own row but none by
this count is ranked after every worker that has, not dropped. The worker stays the judge, and a
create is refused for want of room only once every worker that fits by the catalog said so; a
count that runs ahead of the truth (a row that shows a create, come before its answer) costs at
most a worse pick, never a refusal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from souk.broker.placement.candidates import Candidate
from souk.models.catalog import WorkerRow
from souk.models.guest import GuestConfig

# How long a reservation the worker answered still counts when no newer row of the worker has
# come: well past the catalog's lag (milliseconds), so that a worker whose rows stopped coming is
# not ranked as fuller than it is for long.
ANSWERED_COUNTS_FOR = 2.0
MAX_WORKERS = 100_000  # workers with reservations kept: past it, the answered ones are dropped


@dataclass(eq=False, slots=True)
class Reservation:
    """One create this broker reserves on a worker: its size, the worker's row as the catalog
    showed it when the create left (None if it showed none), and when the worker took it."""

    worker: str
    cpus: int
    memory_mb: int
    row: WorkerRow | None
    answered_at: float | None = None  # monotonic


class PendingRoom:
    """Every worker's pending reservations. `row_of`: the worker's row as last seen (the
    placer's candidate cache holds it), by which a taken create is known to be in the catalog:
    a worker answers once it has committed, so any row newer than the one of when the create
    left is taken to have it."""

    __slots__ = ("_workers", "row_of")

    def __init__(self, row_of: Callable[[str], WorkerRow | None]) -> None:
        self.row_of = row_of
        self._workers: dict[str, list[Reservation]] = {}

    def reserving(self, worker: str, guest: GuestConfig) -> Reservation:
        """A create on its way to `worker`, counted until `ended`."""
        r = Reservation(worker, guest.cpus, guest.memory_mb, self.row_of(worker))
        if len(self._workers) >= MAX_WORKERS:  # workers gone since: their creates are answered
            self._workers = {
                w: held
                for w, held in self._workers.items()
                if any(p.answered_at is None for p in held)
            }
        self._workers.setdefault(worker, []).append(r)
        return r

    def ended(self, r: Reservation, taken: bool) -> None:
        """The worker answered: `taken`, it counts until the catalog shows it; refused (or no
        answer), it no longer counts."""
        if taken:
            r.answered_at = time.monotonic()
            return
        held = [p for p in self._workers.get(r.worker, ()) if p is not r]
        if held:
            self._workers[r.worker] = held
        else:
            self._workers.pop(r.worker, None)

    def split(
        self, cands: list[Candidate], guest: GuestConfig, offered: bool
    ) -> tuple[list[Candidate], list[Candidate]]:
        """The candidates with room for `guest` once what is pending on them is counted (as
        they will be), and those with room only by what they show, to be ranked after them.
        `offered`: candidates from the workers' own offers, which show every create they have
        answered, so only those on their way count."""
        if not self._workers:
            return cands, []
        now, fit, later = time.monotonic(), [], []
        gc, gm = guest.cpus, guest.memory_mb
        for c in cands:
            taken = self._taken(c.worker, offered, now)
            if taken == (0, 0):
                fit.append(c)
                continue
            cpus, memory_mb = c.cpus_free - taken[0], c.memory_mb_free - taken[1]
            if gc <= cpus and gm <= memory_mb:
                fit.append(replace(c, cpus_free=cpus, memory_mb_free=memory_mb))
            else:
                later.append(c)
        return fit, later

    def _taken(self, worker: str, offered: bool, now: float) -> tuple[int, int]:
        held = self._workers.get(worker)
        if held is None:
            return 0, 0
        row = self.row_of(worker)
        held = [r for r in held if not _shown(r, row, now)]
        if not held:
            del self._workers[worker]
            return 0, 0
        self._workers[worker] = held
        counted = [r for r in held if not offered or r.answered_at is None]
        return sum(r.cpus for r in counted), sum(r.memory_mb for r in counted)

    def __len__(self) -> int:
        return sum(map(len, self._workers.values()))


def _shown(r: Reservation, row: WorkerRow | None, now: float) -> bool:
    """Whether the catalog shows a reservation by now (`row`: the worker's, as last seen)."""
    if r.answered_at is None:
        return False
    return row is not r.row or now - r.answered_at > ANSWERED_COUNTS_FOR

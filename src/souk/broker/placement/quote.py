"""The market's quote, without reserving anything: how many machines of a guest each region
could take now, and where N of them would go. Read from the catalog's picture (no worker is
asked), by the same fit rule and policy the placer uses, so a quote is what a create would
see at that moment; only a reservation decides."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from souk.broker.placement.candidates import Candidate, misfit_in
from souk.broker.placement.policies import REFUSE, Policy
from souk.models.catalog import WorkerRow
from souk.models.guest import GuestConfig


def room_for(row: WorkerRow, guest: GuestConfig) -> int:
    """How many machines of `guest` the worker could take now, by the fit rule."""
    if misfit_in(row, guest, row.cordoned, row.draining) is not None:
        return 0
    return min(row.cpus_free // guest.cpus, row.memory_mb_free // guest.memory_mb)


def capacity(rows: Iterable[WorkerRow], guest: GuestConfig) -> int:
    return sum(room_for(row, guest) for row in rows)


def place_many(
    rows: Iterable[WorkerRow],
    guest: GuestConfig,
    count: int,
    policy: Policy,
    rng: random.Random | None = None,
) -> Counter[str]:
    """Where `count` machines would go, one after another, each on the worker the policy
    ranks best once the ones before it are counted in (so a spreading policy spreads): worker
    id -> machines. Fewer than `count` when the workers run out of room."""
    draw = (rng or random.Random()).random
    cands = [Candidate.from_row(row) for row in rows if room_for(row, guest) > 0]
    placed: Counter[str] = Counter()
    for _ in range(count):
        best: tuple[float, int] | None = None
        for i, cand in enumerate(cands):
            if not cand.fits(guest):
                continue
            score = policy(cand, guest)
            if score <= REFUSE:
                continue
            score += draw() * 1e-9  # ties at random, as the ranked stage breaks them
            if best is None or score > best[0]:
                best = (score, i)
        if best is None:
            break
        chosen = cands[best[1]]
        placed[chosen.worker] += 1
        cands[best[1]] = replace(
            chosen,
            cpus_free=chosen.cpus_free - guest.cpus,
            memory_mb_free=chosen.memory_mb_free - guest.memory_mb,
        )
    return placed

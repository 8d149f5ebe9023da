"""The last placement decisions of this broker, kept to explain them later.

Recording runs on every create, and a create aims at half a millisecond of the broker's CPU, so
a record keeps references to what the pipeline built anyway (its ranked lists and its refusal
list) and nothing is copied or formatted until someone asks: `explain` builds the answer. Only
the last `limit` creates are kept, in a ring: memory stays bounded however many machines the
broker places.

Brokers share no state, so a machine placed through another broker, or more than `limit`
creates ago, has no record here: the API says so with a 404 and reason `not_recorded`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from souk.broker.placement.policies import POLICIES, Policy
from souk.broker.placement.stages import Ranked, Refusals
from souk.models.api import Refusal
from souk.models.guest import GuestConfig
from souk.models.placement import PlacementCandidate, PlacementExplanation

KEEP = 1000  # creates explained per broker
WEIGHT = 200_000  # workers named by all the kept decisions together, at most


@dataclass(slots=True)
class Decision:
    """References to one decision's parts, as the pipeline left them."""

    machine: str
    app: str
    region: str
    strategy: str
    policy: Policy
    guest: GuestConfig
    rounds: list[Ranked]
    refusals: Refusals | list[Refusal]  # read only to explain it
    winner: str
    decided_at: float
    took: float
    weight: int = 0  # the workers it names: what it holds in memory, roughly

    def explain(self) -> PlacementExplanation:
        seen: OrderedDict[str, PlacementCandidate] = OrderedDict()
        for n, ranked in enumerate(self.rounds, 1):
            for i, (score, cand) in enumerate(ranked, 1):
                seen[cand.worker] = PlacementCandidate(
                    worker=cand.worker,
                    outcome="placed" if cand.worker == self.winner else "ranked",
                    score=round(score, 6),
                    rank=i,
                    round=n,
                    cpus_free=cand.cpus_free,
                    memory_mb_free=cand.memory_mb_free,
                    image_cached=cand.image_cached,
                )
        for refusal in self.refusals:
            known = seen.get(refusal.worker)
            if known is not None and known.outcome != "placed":
                known.outcome, known.reason = "refused", refusal.reason
            elif known is None:
                seen[refusal.worker] = PlacementCandidate(
                    worker=refusal.worker, outcome="refused", reason=refusal.reason
                )
        order = {"placed": 0, "ranked": 1, "refused": 2}
        cands = sorted(seen.values(), key=lambda c: (order[c.outcome], -(c.score or 0.0)))
        return PlacementExplanation(
            machine=self.machine,
            app=self.app,
            region=self.region,
            strategy=self.strategy,
            policy=next((n for n, p in POLICIES.items() if p is self.policy), "custom"),
            cpu_kind=self.guest.cpu_kind,
            cpus=self.guest.cpus,
            memory_mb=self.guest.memory_mb,
            winner=self.winner,
            decided_at=self.decided_at,
            took_ms=round(self.took * 1000, 3),
            candidates=cands,
        )


class Journal:
    """The last `limit` decisions by machine id, oldest dropped first; fewer when they name
    more than `weight` workers in all (a create naming an image ranks a whole region)."""

    __slots__ = ("_kept", "_weight", "limit", "weight")

    def __init__(self, limit: int = KEEP, weight: int = WEIGHT) -> None:
        self.limit = limit
        self.weight = weight
        self._weight = 0
        self._kept: OrderedDict[str, Decision] = OrderedDict()

    def record(self, decision: Decision) -> None:
        kept = self._kept
        decision.weight = len(decision.refusals) + sum(map(len, decision.rounds))
        old = kept.pop(decision.machine, None)
        if old is not None:
            self._weight -= old.weight
        kept[decision.machine] = decision
        self._weight += decision.weight
        while len(kept) > 1 and (len(kept) > self.limit or self._weight > self.weight):
            self._weight -= kept.popitem(last=False)[1].weight

    def get(self, machine_id: str) -> Decision | None:
        return self._kept.get(machine_id)

    def explanation(self, app: str, machine_id: str) -> PlacementExplanation | None:
        """The recorded decision for `app`'s machine, explained; None when it is not kept (or the
        id belongs to another app): the API and the dashboard read it alike."""
        decision = self._kept.get(machine_id)
        if decision is None or decision.app != app:
            return None
        return decision.explain()

    def __len__(self) -> int:
        return len(self._kept)

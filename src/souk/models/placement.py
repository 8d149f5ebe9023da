"""A placement decision as the broker explains it (`GET .../machines/{id}/placement`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

Outcome = Literal["placed", "ranked", "refused"]


class PlacementCandidate(BaseModel):
    """One worker the decision looked at: placed on, ranked but not needed, or refused (with
    the reason: the catalog's fit rule, the worker's own offer, or its answer to the
    reservation). A worker ranked and then refused at reservation has both a score and a
    reason."""

    worker: str
    outcome: Outcome
    score: float | None = None
    rank: int | None = None  # 1 is the best, within its round
    round: int | None = None  # offer round or catalog slice, from 1
    reason: str | None = None
    cpus_free: int | None = None
    memory_mb_free: int | None = None
    image_cached: bool | None = None


class PlacementExplanation(BaseModel):
    machine: str
    app: str
    region: str
    strategy: str  # as taken: `auto` resolved
    policy: str
    cpu_kind: str
    cpus: int
    memory_mb: int
    winner: str
    decided_at: float  # unix time
    took_ms: float  # from the start of the decision to the reservation's answer
    candidates: list[PlacementCandidate]

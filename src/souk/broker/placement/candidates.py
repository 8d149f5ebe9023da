"""A worker as placement sees it, and the cache that keeps one per version of a catalog row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from souk.models.capacity import Capacity
from souk.models.catalog import WorkerRow
from souk.models.fit import Misfit, misfit
from souk.models.guest import CpuKind, GuestConfig

MAX_CANDIDATES = 100_000  # workers whose candidate is kept between creates


@dataclass(frozen=True, slots=True)
class Candidate:
    """One worker as placement sees it: totals, what is free now, and whether the image is
    already there. Built from a catalog row (possibly stale) or a fresh offer."""

    worker: str
    address: str
    cpu_kinds: tuple[CpuKind, ...]
    cpus_total: int
    memory_mb_total: int
    cpus_free: int
    memory_mb_free: int
    image_cached: bool = False

    @classmethod
    def from_row(cls, row: WorkerRow, image_cached: bool = False) -> Candidate:
        return cls(
            worker=row.id,
            address=row.address,
            cpu_kinds=row.cpu_kinds,
            cpus_total=row.cpus_total,
            memory_mb_total=row.memory_mb_total,
            cpus_free=row.cpus_total - row.cpus_reserved,
            memory_mb_free=row.memory_mb_total - row.memory_mb_reserved,
            image_cached=image_cached,
        )

    @classmethod
    def from_capacity(cls, cap: Capacity, address: str, image_cached: bool = False) -> Candidate:
        return cls(
            worker=cap.worker,
            address=address,
            cpu_kinds=tuple(cap.cpu_kinds),
            cpus_total=cap.total.cpus,
            memory_mb_total=cap.total.memory_mb,
            cpus_free=cap.free.cpus,
            memory_mb_free=cap.free.memory_mb,
            image_cached=image_cached,
        )

    def misfit(
        self, guest: GuestConfig, cordoned: bool = False, draining: bool = False
    ) -> Misfit | None:
        """Why the guest does not fit here, by the worker's rule (`souk.models.fit`). A cordon
        or a drain is the row's, not the candidate's: the caller who has the row passes it."""
        return misfit_in(self, guest, cordoned, draining)

    def fits(self, guest: GuestConfig) -> bool:
        return self.misfit(guest) is None


class Room(Protocol):
    """What a worker has free, as a candidate or a catalog row shows it."""

    @property
    def cpu_kinds(self) -> tuple[CpuKind, ...]: ...

    @property
    def cpus_free(self) -> int: ...

    @property
    def memory_mb_free(self) -> int: ...


def misfit_in(
    room: Room, guest: GuestConfig, cordoned: bool = False, draining: bool = False
) -> Misfit | None:
    """Why the guest does not fit in what `room` has free, by the worker's rule
    (`souk.models.fit.misfit`), or None."""
    return misfit(
        guest.cpu_kind,
        guest.cpus,
        guest.memory_mb,
        kinds=room.cpu_kinds,
        cpus_free=room.cpus_free,
        memory_mb_free=room.memory_mb_free,
        cordoned=cordoned,
        draining=draining,
    )


class CandidateCache:
    """Each row as a candidate, built once per version of the row: a catalog hands out the same
    row object until its owner changes it, and at a thousand workers building the candidates
    anew for every create would cost more than ranking them."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int = MAX_CANDIDATES) -> None:
        self.limit = limit
        self.held: dict[str, tuple[WorkerRow, Candidate]] = {}

    def __call__(self, row: WorkerRow) -> Candidate:
        held = self.held.get(row.id)
        if held is None or held[0] is not row:
            if len(self.held) >= self.limit:
                self.held.clear()
            held = self.held[row.id] = (row, Candidate.from_row(row))
        return held[1]

    def row(self, worker: str) -> WorkerRow | None:
        """The worker's row as last seen, if it was."""
        held = self.held.get(worker)
        return held[0] if held is not None else None

    def address(self, worker: str) -> str | None:
        """The worker's address as last seen, if its row was: where a create placed on it is
        confirmed, without copying the row out of the catalog again."""
        held = self.held.get(worker)
        return held[1].address if held is not None else None

    def __len__(self) -> int:
        return len(self.held)

"""The read side of the catalog, as the broker and the proxy use it.

Reads are synchronous on purpose: a replica answers from memory (mirroring its SQLite file), so a
caller ranking workers or picking a backend never yields to the event loop mid-decision.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from souk.models.catalog import AppRow, MachineRow, RowChange, VolumeRow, WorkerRow


class CatalogView(Protocol):
    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        """Workers, optionally of one region; by default only those heard from recently."""
        ...

    def placeable(self, region: str) -> list[WorkerRow]:
        """The region's reachable workers, as held: shared rows, not to be modified, without the
        liveness fields a `workers()` copy fills in. Placement reads a whole region per create,
        and at a thousand workers copying the rows would cost more than ranking them."""
        ...

    def silent(self, region: str) -> list[WorkerRow]:
        """The region's workers that `placeable` leaves out (not heard from lately), as
        `workers()` shows them. Placement looks at them once a second, and copying a whole
        region of 10,000 rows to find the few silent ones was a 30 ms stall."""
        ...

    def worker(self, worker_id: str) -> WorkerRow | None:
        """One worker, reachable or not (see `WorkerRow.unreachable`)."""
        ...

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]:
        """Machines, optionally of one app and/or region; destroyed ones stay (in that state)
        until their owner forgets them."""
        ...

    def machine(self, machine_id: str) -> MachineRow | None: ...

    def volumes(self, app: str | None = None) -> list[VolumeRow]:
        """Volumes not destroyed, optionally of one app (each owned by its worker)."""
        ...

    def apps(self) -> list[AppRow]:
        """Apps from the registry's rows (deleted ones flagged)."""
        ...

    def app(self, name: str) -> AppRow | None: ...

    def revoked(self, token_id: str) -> bool:
        """Whether the app registry has revoked this token id."""
        ...

    def placeable_holding(self, region: str, image: str) -> list[WorkerRow]:
        """The rows of `placeable(region)` whose workers hold the image (by digest, or by the
        reference it was pulled as), found without reading the region."""
        ...

    def regions_of_app(self, app: str) -> list[str]:
        """The regions where the app has machines, from the global index (every replica has it,
        even one that follows a single region)."""
        ...

    def subscribe(
        self, tables: frozenset[str] | None = None, since: int | None = None
    ) -> AsyncIterator[RowChange]:
        """Row changes as this replica applies them, from local sequence `since` (exclusive) or
        from now; resumable by passing the last `RowChange.lseq` seen."""
        ...

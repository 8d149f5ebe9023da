"""The read side of the catalog, as the broker and the proxy use it.

Reads are synchronous on purpose: a replica answers from memory (mirroring its SQLite file), so a
caller ranking workers or picking a backend never yields to the event loop mid-decision.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Protocol

from souk.catalog.index import Indexes
from souk.catalog.index.apps import AppIndex
from souk.catalog.index.images import ImageIndex
from souk.catalog.index.machines import MachineIndex
from souk.catalog.index.revocations import RevocationIndex
from souk.catalog.index.volumes import VolumeIndex
from souk.catalog.index.workers import Placeable, WorkerIndex
from souk.catalog.owners import Liveness, OwnerState
from souk.models.catalog import AppRow, MachineRow, Row, RowChange, VolumeRow, WorkerRow


class CatalogView(Protocol):
    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        """Workers, optionally of one region; by default only those heard from recently."""
        ...

    def placeable(self, region: str) -> list[WorkerRow]:
        """The region's reachable workers, as held: shared rows, not to be modified, without the
        liveness fields a `workers()` copy fills in. Placement reads a whole region per create,
        and at a thousand workers copying the rows would cost more than ranking them."""
        ...

    def worker_regions(self) -> list[str]:
        """Every region the catalog holds a worker in, reachable or not, sorted."""
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


class FleetView:
    """The queries of `CatalogView` (but the change stream) over a replica's indexes, and what a
    replica adds to a worker row that no owner writes: `unreachable` and `last_heartbeat`."""

    def __init__(self, indexes: Indexes, owners: dict[str, OwnerState], liveness: Liveness) -> None:
        self.indexes = indexes
        self.owners = owners
        self.liveness = liveness
        self._workers = indexes.of(WorkerIndex)
        self._machines = indexes.of(MachineIndex)
        self._images = indexes.of(ImageIndex)
        self._volumes = indexes.of(VolumeIndex)
        self._apps = indexes.of(AppIndex)
        self._revoked = indexes.of(RevocationIndex)

    def reachable(self, owner: str) -> bool:
        return self.liveness.reachable(owner)

    def _worker_view(self, row: WorkerRow) -> WorkerRow:
        st = self.owners.get(row.id)
        return row.model_copy(
            update={
                "unreachable": not self.reachable(row.id),
                "last_heartbeat": st.heard_wall if st else None,
            }
        )

    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        held = self._workers
        rows = held.rows if region is None else held.in_region.get(region, {})
        return [
            self._worker_view(w)
            for w in rows.values()
            if not reachable_only or self.reachable(w.id)
        ]

    def placeable(self, region: str) -> list[WorkerRow]:
        """The region's reachable workers, as held (see `CatalogView.placeable`): the list kept
        in `Placeable`, always the same object, so not to be modified, and to be read before
        the caller next yields."""
        return self._held(region).rows

    def _held(self, region: str) -> Placeable:
        self.liveness.expire(time.monotonic())
        return self._workers.held(region)

    def worker_regions(self) -> list[str]:
        return sorted(name for name, rows in self._workers.in_region.items() if rows)

    def silent(self, region: str) -> list[WorkerRow]:
        """The region's workers not heard from lately (`placeable` leaves them out), as
        `workers()` shows them: only these are looked at and copied, usually none."""
        rows = self._workers.in_region.get(region, {})
        return [self._worker_view(rows[key]) for key in self._held(region).left_out]

    def worker(self, worker_id: str) -> WorkerRow | None:
        row = self._workers.rows.get(worker_id)
        return None if row is None else self._worker_view(row)

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]:
        held = self._machines
        ids = held.by_app.get(app, set()) if app is not None else held.rows.keys()
        rows = (held.rows[i] for i in ids)
        return [m for m in rows if region is None or m.region == region]

    def machine(self, machine_id: str) -> MachineRow | None:
        return self._machines.rows.get(machine_id)

    def volumes(self, app: str | None = None) -> list[VolumeRow]:
        return [v for v in self._volumes.rows.values() if app in (None, v.app)]

    def placeable_holding(self, region: str, image: str) -> list[WorkerRow]:
        """The region's placeable rows (as `placeable` holds them) of workers holding the
        image: looked up by image, so the region is never scanned for it."""
        holders = self._images.holders.get(image)
        if not holders:
            return []
        held = self._held(region)
        rows, pos = held.rows, held.pos
        return [rows[at] for owner in holders if (at := pos.get(owner)) is not None]

    def regions_of_app(self, app: str) -> list[str]:
        """From the rows held (followed regions, current to the millisecond) and from heartbeats
        (every region, current to the second)."""
        held = {m.region for m in self.machines(app=app) if m.state != "destroyed"}
        return sorted(held | {st.region for st in self.owners.values() if app in st.apps})

    def apps(self) -> list[AppRow]:
        return sorted(self._apps.rows.values(), key=lambda a: a.name)

    def app(self, name: str) -> AppRow | None:
        return self._apps.rows.get(name)

    def revoked(self, token_id: str) -> bool:
        return token_id in self._revoked.rows

    def row(self, owner: str, table: str, key: str) -> Row | None:
        """The row of `owner` held under `key` in `table`, None if none is (or it was deleted)."""
        return self.indexes.row(owner, table, key)

    def head(self, owner: str) -> int:
        st = self.owners.get(owner)
        return st.head if st else 0

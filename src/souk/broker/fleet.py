"""What the broker needs to know about the fleet, and two ways to know it.

`Fleet` is the read side: workers, machines and apps. `CatalogFleet` is the normal one: a
catalog replica for workers and machines, the app registry for apps. `StaticFleet` reads a
fixed list of workers directly over HTTP; it serves tests and setups that run no catalog.

Reads are synchronous on purpose: a replica is a local SQLite database, and placement must not
yield to the event loop while it looks at the picture it is about to rank.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from souk.broker.registry import AppRegistry
from souk.catalog.view import CatalogView
from souk.clients.workers import WorkerCallError, WorkerClient
from souk.models.catalog import AppRow, MachineRow, WorkerRow, machine_row, worker_row


class Fleet(Protocol):
    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        """Workers, optionally of one region, optionally only those heard from recently."""
        ...

    def placeable(self, region: str) -> list[WorkerRow]:
        """The region's reachable workers for placement (see `CatalogView.placeable`)."""
        ...

    def silent(self, region: str) -> list[WorkerRow]:
        """The region's workers `placeable` leaves out (see `CatalogView.silent`)."""
        ...

    def worker_regions(self) -> list[str]:
        """Every region with a worker, reachable or not (see `CatalogView.worker_regions`)."""
        ...

    def worker(self, worker_id: str) -> WorkerRow | None: ...

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]: ...

    def machine(self, machine_id: str) -> MachineRow | None: ...

    def apps(self) -> list[AppRow]:
        """Every live app (never a deleted one's tombstone)."""
        ...

    def app(self, name: str) -> AppRow | None:
        """The app if it is live, else None."""
        ...

    def revoked(self, token_id: str) -> bool:
        """Whether the token id is revoked (see `AppRegistry.revoke`)."""
        ...

    def placeable_holding(self, region: str, image: str) -> list[WorkerRow]:
        """The rows of `placeable(region)` whose workers hold the image (see
        `CatalogView.placeable_holding`)."""
        ...

    def volume_holders(self, app: str) -> set[str] | None:
        """The workers holding the app's volumes, as the catalog shows them; None: this fleet
        does not know (ask every worker)."""
        ...


class StaticFleet:
    """A fixed list of worker URLs, read over HTTP by `refresh()`; apps from a local registry.

    It has no replication, so its picture is as fresh as the last refresh: the broker refreshes
    it before placing (see `Broker.before_place`)."""

    def __init__(
        self, addresses: list[str], registry: AppRegistry, client: WorkerClient | None = None
    ) -> None:
        self.addresses = addresses
        self.registry = registry
        self.client = client or WorkerClient()
        self._workers: dict[str, WorkerRow] = {}
        self._reachable: set[str] = set()
        self._machines: dict[str, MachineRow] = {}

    async def refresh(self, machines: bool = True) -> None:
        async def one(address: str) -> None:
            try:
                cap = await self.client.capacity(address, address, timeout=2)
            except (WorkerCallError, ValueError):
                for wid, row in self._workers.items():
                    if row.address == address:
                        self._reachable.discard(wid)
                return
            self._workers[cap.worker] = worker_row(cap, address)
            self._reachable.add(cap.worker)
            if machines:
                found = await self.client.machines(cap.worker, address, include_deleted=True)
                for machine in found:
                    mrow = machine_row(machine)
                    self._machines[mrow.id] = mrow

        await asyncio.gather(*(one(a) for a in self.addresses))

    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        return [
            w
            for w in self._workers.values()
            if (region is None or w.region == region)
            and (not reachable_only or w.id in self._reachable)
        ]

    def placeable(self, region: str) -> list[WorkerRow]:
        return self.workers(region)

    def silent(self, region: str) -> list[WorkerRow]:
        return [
            w for w in self._workers.values() if w.region == region and w.id not in self._reachable
        ]

    def worker_regions(self) -> list[str]:
        return sorted({w.region for w in self._workers.values()})

    def worker(self, worker_id: str) -> WorkerRow | None:
        return self._workers.get(worker_id)

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]:
        return [
            m
            for m in self._machines.values()
            if (app is None or m.app == app) and (region is None or m.region == region)
        ]

    def machine(self, machine_id: str) -> MachineRow | None:
        return self._machines.get(machine_id)

    def apps(self) -> list[AppRow]:
        return self.registry.list()

    def app(self, name: str) -> AppRow | None:
        return self.registry.get(name)

    def revoked(self, token_id: str) -> bool:
        return self.registry.revoked(token_id)

    def placeable_holding(self, region: str, image: str) -> list[WorkerRow]:
        return []  # what a worker caches is in its offers, not in its capacity

    def volume_holders(self, app: str) -> set[str] | None:
        return None


class CatalogFleet:
    """Everything from a catalog replica (fresh within milliseconds of each commit), except
    apps on the broker that hosts the registry: it reads its own writes. This is the one place
    that chooses between the registry and the replica for apps."""

    def __init__(self, view: CatalogView, registry: AppRegistry | None) -> None:
        self.view = view
        self.registry = registry

    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        return self.view.workers(region, reachable_only)

    def placeable(self, region: str) -> list[WorkerRow]:
        return self.view.placeable(region)

    def silent(self, region: str) -> list[WorkerRow]:
        return self.view.silent(region)

    def worker_regions(self) -> list[str]:
        return self.view.worker_regions()

    def worker(self, worker_id: str) -> WorkerRow | None:
        return self.view.worker(worker_id)

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]:
        return self.view.machines(app, region)

    def machine(self, machine_id: str) -> MachineRow | None:
        return self.view.machine(machine_id)

    def apps(self) -> list[AppRow]:
        if self.registry is not None:
            return self.registry.list()
        return [a for a in self.view.apps() if not a.deleted]

    def app(self, name: str) -> AppRow | None:
        if self.registry is not None:
            return self.registry.get(name)
        row = self.view.app(name)
        return row if row is not None and not row.deleted else None

    def revoked(self, token_id: str) -> bool:
        if self.registry is not None:
            return self.registry.revoked(token_id)
        return self.view.revoked(token_id)

    def placeable_holding(self, region: str, image: str) -> list[WorkerRow]:
        return self.view.placeable_holding(region, image)

    def volume_holders(self, app: str) -> set[str] | None:
        return {v.worker_id for v in self.view.volumes(app)}

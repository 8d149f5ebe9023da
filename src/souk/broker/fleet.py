"""What the broker needs to know about the fleet, and two ways to know it.

`Fleet` is the read side: workers, machines and apps, normally a catalog replica (see
`souk.broker.catalog_fleet`). `StaticFleet` reads a fixed list of workers directly over HTTP;
it serves tests, benchmarks and single-host setups that run no catalog.

Reads are synchronous on purpose: a replica is a local SQLite database, and placement must not
yield to the event loop while it looks at the picture it is about to rank.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from souk.broker.registry import AppRegistry
from souk.broker.workers import WorkerClient, WorkerError
from souk.models.capacity import Capacity
from souk.models.catalog import AppRow, MachineRow, WorkerRow
from souk.models.machine import Machine


class Fleet(Protocol):
    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        """Workers, optionally of one region, optionally only those heard from recently."""
        ...

    def worker(self, worker_id: str) -> WorkerRow | None: ...

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]: ...

    def machine(self, machine_id: str) -> MachineRow | None: ...

    def apps(self) -> list[AppRow]: ...

    def app(self, name: str) -> AppRow | None: ...

    def image_cached(self, worker_id: str, image: str) -> bool: ...


def worker_row(cap: Capacity, address: str, epoch: str = "static") -> WorkerRow:
    return WorkerRow(
        id=cap.worker,
        region=cap.region,
        address=address,
        cpu_kinds=cap.cpu_kinds,
        cpus_total=cap.total.cpus,
        memory_mb_total=cap.total.memory_mb,
        cpus_reserved=cap.reserved.cpus,
        memory_mb_reserved=cap.reserved.memory_mb,
        machines=cap.machines,
        labels=cap.labels,
        cordoned=cap.cordoned,
        draining=cap.draining,
        epoch=epoch,
    )


def machine_row(m: Machine) -> MachineRow:
    guest = m.config.guest
    return MachineRow(
        id=m.id,
        app=m.app,
        region=m.region,
        worker_id=m.worker,
        name=m.name,
        state=m.state,
        instance_id=m.instance_id,
        cpu_kind=guest.cpu_kind,
        cpus=guest.cpus,
        memory_mb=guest.memory_mb,
        image=m.config.image,
        private_ip=m.private_ip,
        ports=[service.internal_port for service in m.config.services],
        standby_for=m.config.standbys,
        metadata=m.config.metadata,
        updated_at=m.updated_at,
    )


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
                cap = Capacity.model_validate(
                    await self.client.request(address, address, "GET", "/v1/capacity", timeout=2)
                )
            except (WorkerError, ValueError):
                for wid, row in self._workers.items():
                    if row.address == address:
                        self._reachable.discard(wid)
                return
            self._workers[cap.worker] = worker_row(cap, address)
            self._reachable.add(cap.worker)
            if machines:
                data = await self.client.request(
                    cap.worker, address, "GET", "/v1/machines", params={"include_deleted": "true"}
                )
                for item in data:
                    mrow = machine_row(Machine.model_validate(item))
                    self._machines[mrow.id] = mrow

        await asyncio.gather(*(one(a) for a in self.addresses))

    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        return [
            w
            for w in self._workers.values()
            if (region is None or w.region == region)
            and (not reachable_only or w.id in self._reachable)
        ]

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

    def image_cached(self, worker_id: str, image: str) -> bool:
        return False

"""A hand-written catalog view for the proxy's own logic.

The view is a plain in-memory `CatalogView` (no replication): it lets a test say exactly which
machines exist, in which state, on which worker, so routing decisions can be checked one by one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from souk.models.catalog import AppRow, MachineRow, RowChange, VolumeRow, WorkerRow
from souk.models.machine import MachineState

OLD = "2020-01-01T00:00:00+00:00"


class FakeView:
    def __init__(self) -> None:
        self.rows: dict[str, MachineRow] = {}
        self.worker_rows: dict[str, WorkerRow] = {}
        self.app_rows: dict[str, AppRow] = {}

    def add_app(self, name: str, deleted: bool = False) -> None:
        self.app_rows[name] = AppRow(name=name, created_at=OLD, deleted=deleted)

    def add_worker(self, wid: str, region: str, unreachable: bool = False) -> None:
        self.worker_rows[wid] = WorkerRow(
            id=wid,
            region=region,
            address="http://127.0.0.1:1",
            cpu_kinds=["shared"],
            cpus_total=8,
            memory_mb_total=8192,
            cpus_reserved=0,
            memory_mb_reserved=0,
            epoch="e",
            unreachable=unreachable,
        )

    def add(
        self,
        mid: str,
        region: str = "mad",
        app: str = "web",
        state: MachineState = "started",
        port: int | None = 8080,
        ip: str | None = "127.0.0.1",
        worker: str | None = None,
        **kw: Any,
    ) -> MachineRow:
        wid = worker or f"w-{region}"
        if wid not in self.worker_rows:
            self.add_worker(wid, region)
        row = MachineRow(
            id=mid,
            app=app,
            region=region,
            worker_id=wid,
            state=state,
            instance_id=f"i-{mid}",
            cpu_kind="shared",
            cpus=1,
            memory_mb=256,
            private_ip=ip,
            ports=[] if port is None else [port],
            updated_at=kw.pop("updated_at", OLD),
            **kw,
        )
        self.rows[mid] = row
        return row

    def set_state(self, mid: str, state: MachineState) -> None:
        self.rows[mid] = self.rows[mid].model_copy(update={"state": state})

    # --- CatalogView -------------------------------------------------------------------------

    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        return [
            w
            for w in self.worker_rows.values()
            if (region is None or w.region == region) and not (reachable_only and w.unreachable)
        ]

    def placeable(self, region: str) -> list[WorkerRow]:
        return self.workers(region)

    def worker_regions(self) -> list[str]:
        return sorted({w.region for w in self.worker_rows.values()})

    def silent(self, region: str) -> list[WorkerRow]:
        return [w for w in self.workers(region, reachable_only=False) if w.unreachable]

    def worker(self, worker_id: str) -> WorkerRow | None:
        return self.worker_rows.get(worker_id)

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]:
        return [
            m
            for m in self.rows.values()
            if (app is None or m.app == app) and (region is None or m.region == region)
        ]

    def machine(self, machine_id: str) -> MachineRow | None:
        return self.rows.get(machine_id)

    def apps(self) -> list[AppRow]:
        return list(self.app_rows.values())

    def app(self, name: str) -> AppRow | None:
        return self.app_rows.get(name)

    def volumes(self, app: str | None = None) -> list[VolumeRow]:
        return []

    def placeable_holding(self, region: str, image: str) -> list[WorkerRow]:
        return []

    def revoked(self, token_id: str) -> bool:
        return False

    def regions_of_app(self, app: str) -> list[str]:
        return sorted({m.region for m in self.machines(app=app) if m.state != "destroyed"})

    async def subscribe(
        self, tables: frozenset[str] | None = None, since: int | None = None
    ) -> AsyncIterator[RowChange]:
        await asyncio.Event().wait()
        yield  # type: ignore[misc]

"""A simulated owner: a worker's rows in memory, for tests, the propagation benchmark and
`souk catalog sim-owner`. It keeps the same contract as a real worker's rows: every change gets
the next sequence number, deletions leave a versioned tombstone."""

from __future__ import annotations

import itertools
import time
from typing import Any

from souk.catalog.owner import Owner
from souk.catalog.protocol import Change
from souk.models.catalog import MachineRow, WorkerRow


class SimRows:
    def __init__(self, owner: str, region: str, epoch: str = "e1", cpus: int = 64) -> None:
        self.owner, self.region, self.epoch = owner, region, epoch
        self.seq = 0
        self.rows: dict[tuple[str, str], Change] = {}
        self.cpus = cpus
        self.ids = itertools.count(1)
        self.publisher: Owner | None = None
        self.put("workers", owner, self.worker_row(0).model_dump(mode="json"))

    def worker_row(self, reserved: int) -> WorkerRow:
        return WorkerRow(
            id=self.owner,
            region=self.region,
            address=f"http://{self.owner}.invalid",
            cpu_kinds=("shared",),
            cpus_total=self.cpus,
            memory_mb_total=self.cpus * 1024,
            cpus_reserved=reserved,
            memory_mb_reserved=reserved * 256,
            epoch=self.epoch,
        )

    def put(self, table: str, key: str, row: dict[str, Any] | None) -> Change:
        self.seq += 1
        change = Change(table, key, self.seq, row)
        self.rows[(table, key)] = change
        if self.publisher is not None:
            self.publisher.committed(self.seq, [change])
        return change

    def machine(self, app: str, state: str = "started", key: str | None = None) -> Change:
        mid = key or f"{self.owner}-m{next(self.ids)}"
        row = MachineRow(
            id=mid,
            app=app,
            region=self.region,
            worker_id=self.owner,
            state=state,  # type: ignore[arg-type]
            instance_id=f"i{self.seq + 1}",
            cpu_kind="shared",
            cpus=1,
            memory_mb=256,
            updated_at=f"{time.time():.6f}",
        )
        return self.put("machines", mid, row.model_dump(mode="json"))

    # RowSource
    def head(self) -> int:
        return self.seq

    def changes_since(self, since: int, limit: int) -> tuple[list[Change], int, bool]:
        newer = sorted((c for c in self.rows.values() if c.seq > since), key=lambda c: c.seq)
        if len(newer) > limit:
            return newer[:limit], newer[limit - 1].seq, True
        return newer, self.seq, False

    def apps(self) -> list[str]:
        return sorted(
            {
                c.row["app"]
                for c in self.rows.values()
                if c.table == "machines" and c.row is not None and c.row["state"] != "destroyed"
            }
        )

    def live(self) -> dict[tuple[str, str], tuple[int, dict[str, Any] | None]]:
        """What a converged replica must hold of this owner."""
        return {k: (c.seq, c.row) for k, c in self.rows.items()}

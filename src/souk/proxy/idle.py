"""Autostop: machines nobody has used for a while are stopped through the broker.

A started machine is idle when it has no request in flight through this proxy and none has
started or ended for `idle_timeout` seconds, counted from the later of its last request and the
moment this proxy first saw it started (so a proxy that just came up does not stop everything
at once). Only machines whose first service has autostop on (`"stop"`, `"suspend"` or true;
suspend is treated as stop) are stopped, and never below `min_machines_running` started machines
of the app in the machine's region: souk applies the minimum per region, to every region where
the app runs (Fly applies it to the primary region only; souk apps have no primary region).
Hidden machines (a deploy in progress) are left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict

from souk.clients.machines import MachinesApiError, MachinesClient
from souk.logsetup import about
from souk.models.catalog import MachineRow
from souk.node.periodic import every
from souk.proxy.metrics import ProxyMetrics
from souk.proxy.routing import STOPPING_FOR, Router, hidden

log = logging.getLogger("souk.proxy.idle")


class Autostop:
    def __init__(self, router: Router, broker: MachinesClient, idle_timeout: float = 60.0) -> None:
        """Works on the router's view of the fleet, its loads, marks and service settings."""
        self.broker = broker
        self.router = router
        self.idle_timeout = idle_timeout
        self.first_seen: dict[str, float] = {}  # started machine id -> when this proxy saw it
        self.stopped: list[str] = []  # machines this proxy stopped, for reporting and tests
        self.metrics: ProxyMetrics | None = None

    @property
    def every(self) -> float:
        return max(0.05, min(self.idle_timeout / 4, 5.0))

    async def run(self) -> None:
        await every(lambda: self.every, self.sweep, what="autostop sweep", log=log)

    def idle_since(self, row: MachineRow) -> float:
        return max(self.router.loads.last_used.get(row.id, 0.0), self.first_seen.get(row.id, 0.0))

    def due(self) -> list[MachineRow]:
        """Machines to stop now, chosen without yielding (and marked so no request picks them)."""
        now = time.monotonic()
        started: dict[tuple[str, str], list[MachineRow]] = defaultdict(list)
        seen: set[str] = set()
        for row in self.router.view.machines():
            if row.state != "started" or hidden(row) or not self.router.reachable(row):
                continue
            seen.add(row.id)
            self.first_seen.setdefault(row.id, now)
            if not self.router.marks.has("stopping", row.id):
                started[(row.app, row.region)].append(row)
        for mid in [m for m in self.first_seen if m not in seen]:
            del self.first_seen[mid]
        self.router.loads.forget(seen)
        chosen: list[MachineRow] = []
        for rows in started.values():
            policies = {row.id: self.router.policies.of(row) for row in rows}
            keep = max(p.min_machines_running for p in policies.values())
            idle = [
                row
                for row in rows
                if policies[row.id].autostop
                and self.router.loads.of(row.id) == 0
                and now - self.idle_since(row) >= self.idle_timeout
            ]
            idle.sort(key=self.idle_since)  # the longest idle go first
            for row in idle[: max(0, len(rows) - keep)]:
                self.router.marks.set("stopping", row.id, STOPPING_FOR)
                self.router.marks.clear("woken", row.id)
                chosen.append(row)
        return chosen

    async def sweep(self) -> list[str]:
        """Stops what is due; returns the ids asked to stop."""
        chosen = self.due()
        if not chosen:
            return []
        results = await asyncio.gather(*(self._stop(row) for row in chosen))
        return [row.id for row, ok in zip(chosen, results, strict=True) if ok]

    async def _stop(self, row: MachineRow) -> bool:
        what = about(row.id, row.state, app=row.app)
        log.info("stopping %s of %s in %s: idle", row.id, row.app, row.region, extra=what)
        try:
            await self.broker.stop(row.app, row.id)
        except MachinesApiError as exc:
            log.warning("could not stop idle %s of %s: %s", row.id, row.app, exc, extra=what)
            self.router.marks.clear("stopping", row.id)
            if self.metrics is not None:
                self.metrics.autostops["failed"].inc()
            return False
        if self.metrics is not None:
            self.metrics.autostops["ok"].inc()
        self.stopped.append(row.id)
        del self.stopped[:-1000]
        return True


async def stop_task(task: asyncio.Task[None] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

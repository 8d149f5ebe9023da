"""A replica: every followed owner's rows, kept current by sequence, queried from memory.

It is made of parts, each in its own module: the tables' indexes (`souk.catalog.index`), the
queries over them (`souk.catalog.view`), applying rows (`souk.catalog.apply`), the change stream
(`souk.catalog.stream`), and what keeps it current over the bus (`souk.catalog.sync`: live
batches, heartbeats, pulls, certificates, bootstrap, snapshots, the audit). This module puts
them together and starts and stops them.

With a `Trust`, nothing is applied before its owner's signature checks out
(`souk.catalog.guard`), but a live batch on its owner's own subject of an authenticated bus,
which is audited (`souk.catalog.sync.audit`); every row and head is kept with the owner's proof,
so that a snapshot relays the owners' word, not this replica's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

from souk.catalog.apply import Applier
from souk.catalog.bus import Bus, Subscription
from souk.catalog.connecting import link_state
from souk.catalog.guard import Guard
from souk.catalog.index import Indexes
from souk.catalog.index.workers import WorkerIndex
from souk.catalog.owners import UNREACHABLE_AFTER, Liveness, OwnerState
from souk.catalog.protocol import (
    GLOBAL_REGION,
    HELLO,
    SNAPSHOT,
    WILDCARD,
    changes_subject,
    heartbeat_subject,
)
from souk.catalog.store import ReplicaStore
from souk.catalog.stream import ChangeStream, ResyncNeeded
from souk.catalog.sync.audit import AUDIT_RATE, Audit
from souk.catalog.sync.batches import Batches
from souk.catalog.sync.bootstrap import load_snapshot
from souk.catalog.sync.certificates import Certificates
from souk.catalog.sync.heartbeats import Heartbeats
from souk.catalog.sync.pull import PULL_TIMEOUT, Puller
from souk.catalog.sync.snapshot import SnapshotServer
from souk.catalog.sync.tasks import Tasks
from souk.catalog.trust import Refused, Trust
from souk.catalog.view import FleetView
from souk.models.catalog import RowChange

__all__ = ["Replica", "ResyncNeeded", "following"]

_ids = itertools.count(1)


class Replica(FleetView):
    def __init__(
        self,
        bus: Bus,
        path: Path | str = ":memory:",
        regions: list[str] | None = None,
        unreachable_after: float = UNREACHABLE_AFTER,
        name: str | None = None,
        pull_timeout: float = PULL_TIMEOUT,
        trust: Trust | None = None,
        audit_rate: float = AUDIT_RATE,
    ) -> None:
        """`trust`: whom to believe; None makes an insecure replica, which applies unsigned
        rows (`souk dev`, tests), while one with a `Trust` refuses anything unsigned.
        `audit_rate`: the share of live batches checked on an authenticated bus (see
        `souk.catalog.sync.audit`)."""
        self.bus = bus
        self.regions = set(regions) if regions else None
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{next(_ids)}"
        self.store = ReplicaStore(path)
        self.owners: dict[str, OwnerState] = {}
        indexes = Indexes()
        self.versions = indexes.versions
        workers = indexes.of(WorkerIndex)
        liveness = Liveness(self.owners, unreachable_after, workers.leave_out, workers.place)
        workers.reachable = liveness.reachable
        super().__init__(indexes, self.owners, liveness)
        self.stream = ChangeStream(self.store)
        self.applier = Applier(
            self.store, indexes, self.owners, self.stream, liveness, self.regions
        )
        self.stats = self.applier.stats
        self.tasks = Tasks()
        self.certificates = Certificates(
            bus,
            self.tasks,
            pull_timeout,
            lambda: self.guard,
            lambda owner: self.puller.maybe(owner),
        )
        self.guard = Guard(trust, self.certificates.want, self.store.save_cert)
        self.puller = Puller(bus, self.applier, self.guard, self.tasks, pull_timeout)
        self.audit = Audit(bus, audit_rate, self.stats, self.puller.again)
        self.batches = Batches(self.applier, self.guard, self.audit, self.puller)
        self.heartbeats = Heartbeats(self.applier, self.guard, self.puller, self.tasks)
        self.snapshots = SnapshotServer(bus, self.applier, self.name, self.guard.secure)
        self._subs: list[Subscription] = []
        self.ready = asyncio.Event()
        self._load()

    @property
    def unreachable_after(self) -> float:
        return self.liveness.unreachable_after

    @unreachable_after.setter
    def unreachable_after(self, seconds: float) -> None:
        self.liveness.unreachable_after = seconds

    @property
    def on_apply(self) -> Callable[[float], None] | None:
        """Told each apply's seconds (the metrics' histogram)."""
        return self.applier.on_apply

    @on_apply.setter
    def on_apply(self, observe: Callable[[float], None] | None) -> None:
        self.applier.on_apply = observe

    @property
    def bootstrapping(self) -> bool:
        return self.applier.bootstrapping

    # --- lifecycle -------------------------------------------------------------------------

    def _load(self) -> None:
        if self.guard.trust is not None:
            for der in self.store.certs().values():
                with contextlib.suppress(Refused):  # expired since: no longer trusted
                    self.guard.trust.learn(der)
        self.applier.load()

    async def start(self, bootstrap: bool = True, bootstrap_timeout: float = 2.0) -> None:
        follow = [WILDCARD] if self.regions is None else [*sorted(self.regions), GLOBAL_REGION]
        for region in follow:
            sub = await self.bus.subscribe(changes_subject(region), self.batches.on_batch)
            self._subs.append(sub)
        beats = await self.bus.subscribe(heartbeat_subject(WILDCARD), self.heartbeats.on_beat)
        self._subs.append(beats)
        self.tasks.running = True
        if bootstrap and not self.owners:
            await load_snapshot(self.bus, self.applier, self.guard, bootstrap_timeout)
        self._subs.append(await self.bus.subscribe(SNAPSHOT, self.snapshots.on_request))
        self.ready.set()
        for owner in list(self.owners):
            self.puller.maybe(owner)
        self.certificates.hello_at = time.monotonic()
        await self.bus.publish(HELLO, b"{}")

    async def caught_up(self, timeout: float) -> bool:
        """Waits (at most `timeout`) until some owner is known and every known owner's announced
        head is applied: what a process should wait for before it first answers from the view."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.owners and all(st.head >= st.seen for st in self.owners.values()):
                return True
            await asyncio.sleep(0.01)
        return False

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []
        await self.tasks.stop()
        self._flush()
        self.store.close()

    def follows(self, region: str) -> bool:
        return self.applier.follows(region)

    def _flush(self) -> None:
        """Commits what is applied and tells subscribers now (see `ChangeStream.flush`)."""
        self.stream.flush()

    # --- state -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "replica": self.name,
            "bus": link_state(self.bus),
            "regions": None if self.regions is None else sorted(self.regions),
            "owners": [
                {
                    "owner": o,
                    "region": st.region,
                    "epoch": st.epoch,
                    "head": st.head,
                    "announced": st.seen,
                    "lag": max(0, st.seen - st.head),
                    "silent_for": round(now - st.heard, 3) if st.heard else None,
                    "unreachable": not self.reachable(o),
                    **({"suspect": True} if st.suspect else {}),
                }
                for o, st in sorted(self.owners.items())
            ],
            "quarantined": self.store.quarantined(),
            "security": "signed" if self.guard.secure else "insecure",
            "refused": dict(self.guard.refused),
            "stats": dict(self.stats),
        }

    def subscribe(
        self, tables: frozenset[str] | None = None, since: int | None = None
    ) -> AsyncGenerator[RowChange, None]:
        """Changes as they are applied (see `ChangeStream.subscribe`)."""
        return self.stream.subscribe(tables, since)


@contextlib.asynccontextmanager
async def following(
    bus: Bus,
    path: Path | str = ":memory:",
    regions: list[str] | None = None,
    bootstrap: bool = True,
    settle: float = 2.0,
    trust: Trust | None = None,
    audit_rate: float = AUDIT_RATE,
) -> AsyncIterator[Replica]:
    """A started replica, caught up with the owners that answer within `settle` seconds,
    stopped on exit. `bootstrap=False` where no other replica can exist yet (a single-process
    cluster), to skip waiting for a snapshot nobody will send. `trust`, `audit_rate`: see
    `Replica`."""
    replica = Replica(bus, path, regions, trust=trust, audit_rate=audit_rate)
    await replica.start(bootstrap=bootstrap)
    await replica.caught_up(settle)
    try:
        yield replica
    finally:
        await replica.stop()

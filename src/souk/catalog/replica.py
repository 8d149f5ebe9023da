"""A replica: every followed owner's rows, kept current by sequence, queried from memory.

Rules that make it converge whatever the bus does (drop, duplicate, reorder):
- a row version is applied only if its owner sequence is newer than the one held, so duplicates
  and stale copies are no-ops and deletions leave a versioned tombstone;
- an owner's `head` here only advances over contiguous history (a batch whose `prev` we have, or
  a pull reply); a gap, or a heartbeat announcing a higher head, triggers a pull;
- a newer epoch (the owner's database was recreated) replaces all of that owner's rows; an
  older one is a late message from before, and is dropped.
Rows are validated with the shared models before they are applied; a row that fails is
quarantined and reported, and the rest of its batch still applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from souk.catalog.bus import Bus, Message, Subscription
from souk.catalog.protocol import (
    GLOBAL_REGION,
    HELLO,
    REGISTRY_OWNER,
    SNAPSHOT,
    WILDCARD,
    Change,
    ProtocolError,
    PullRequest,
    SnapshotChunk,
    changes_subject,
    decode_batch,
    decode_heartbeat,
    decode_pull_reply,
    decode_snapshot_chunk,
    encode,
    heartbeat_subject,
    pull_subject,
)
from souk.catalog.store import ReplicaStore
from souk.models.catalog import (
    AppRow,
    ImageRow,
    MachineRow,
    RevocationRow,
    Row,
    RowChange,
    WorkerRow,
)

log = logging.getLogger("souk.catalog.replica")

TABLES: dict[str, type[Row]] = {
    "workers": WorkerRow,
    "machines": MachineRow,
    "images": ImageRow,
    "apps": AppRow,
    "revocations": RevocationRow,
}
UNREACHABLE_AFTER = 3.0
PULL_TIMEOUT = 2.0
BEAT_GRACE = 0.25  # how long a heartbeat's news may run ahead of its batches before a pull
SNAPSHOT_CHUNK = 1000
_ids = itertools.count(1)


@dataclass
class OwnerState:
    region: str
    epoch: str
    head: int = 0  # everything up to here is applied
    seen: int = 0  # the highest head the owner has announced
    heard: float = 0.0  # monotonic time of its last message
    heard_wall: float | None = None
    apps: list[str] = field(default_factory=list)
    pulling: bool = False
    checking: bool = False  # a heartbeat's head is to be checked again shortly


@dataclass(frozen=True)
class Entry:
    owner: str
    seq: int
    row: Row | None


class Replica:
    def __init__(
        self,
        bus: Bus,
        path: Path | str = ":memory:",
        regions: list[str] | None = None,
        unreachable_after: float = UNREACHABLE_AFTER,
        name: str | None = None,
        pull_timeout: float = PULL_TIMEOUT,
    ) -> None:
        self.bus = bus
        self.regions = set(regions) if regions else None
        self.unreachable_after = unreachable_after
        self.pull_timeout = pull_timeout
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{next(_ids)}"
        self.store = ReplicaStore(path)
        self.owners: dict[str, OwnerState] = {}
        self.entries: dict[tuple[str, str, str], Entry] = {}
        self._workers: dict[str, WorkerRow] = {}
        self._in_region: dict[str, dict[str, WorkerRow]] = defaultdict(dict)  # placement reads it
        self._machines: dict[str, MachineRow] = {}
        self._by_app: dict[str, set[str]] = defaultdict(set)
        self._images: dict[str, dict[str, ImageRow]] = defaultdict(dict)
        self._apps: dict[str, AppRow] = {}
        self._revoked: set[str] = set()
        self._subs: list[Subscription] = []
        self._listeners: list[asyncio.Queue[RowChange]] = []
        self._unflushed: list[RowChange] = []  # applied, to commit and announce at `_flush`
        self._flush_at: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.bootstrapping = False
        self.ready = asyncio.Event()
        self.stats: dict[str, int] = defaultdict(int)
        self._load()

    # --- lifecycle -------------------------------------------------------------------------

    def _load(self) -> None:
        for owner, region, epoch, head in self.store.owners():
            self.owners[owner] = OwnerState(region, epoch, head, head)
        for owner, table, key, seq, row in self.store.all_rows():
            model = None if row is None else TABLES[table].model_validate(row)
            self._index(owner, table, key, Entry(owner, seq, model))

    async def start(self, bootstrap: bool = True, bootstrap_timeout: float = 2.0) -> None:
        follow = [WILDCARD] if self.regions is None else [*sorted(self.regions), GLOBAL_REGION]
        for region in follow:
            self._subs.append(await self.bus.subscribe(changes_subject(region), self._on_batch))
        self._subs.append(await self.bus.subscribe(heartbeat_subject(WILDCARD), self._on_beat))
        if bootstrap and not self.owners:
            await self._bootstrap(bootstrap_timeout)
        self._subs.append(await self.bus.subscribe(SNAPSHOT, self._on_snapshot_request))
        self.ready.set()
        for owner in list(self.owners):
            self._maybe_pull(owner)
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
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._flush()
        self.store.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def follows(self, region: str) -> bool:
        return self.regions is None or region in self.regions or region == GLOBAL_REGION

    # --- applying ----------------------------------------------------------------------------

    def _owner(self, owner: str, region: str, epoch: str) -> OwnerState | None:
        """The owner's state for a message of this epoch, or None if the message is stale."""
        st = self.owners.get(owner)
        if st is None:
            st = self.owners[owner] = OwnerState(region, epoch)
            self.store.save_owner(owner, region, epoch, 0)
            return st
        if st.epoch == epoch:
            return st
        if epoch < st.epoch:  # epochs sort by the time the owner's database was created
            self.stats["stale_epoch"] += 1
            return None
        log.info("owner %s has a new epoch %s (was %s): replacing its rows", owner, epoch, st.epoch)
        self.stats["new_epoch"] += 1
        for key in [k for k in self.entries if k[0] == owner]:
            self._index(owner, key[1], key[2], None)
        self.store.drop_owner(owner)
        new = OwnerState(region, epoch)
        new.heard, new.heard_wall, new.apps = st.heard, st.heard_wall, st.apps
        self.owners[owner] = new
        self.store.save_owner(owner, region, epoch, 0)
        return new

    def _heard(self, st: OwnerState, head: int) -> None:
        st.heard = time.monotonic()
        st.heard_wall = time.time()
        st.seen = max(st.seen, head)

    def _apply(
        self,
        owner: str,
        region: str,
        changes: list[Change],
        advance: tuple[OwnerState, int] | None = None,
    ) -> int:
        """Applies what is newer than held, and moves the owner's head to `advance` in the same
        transaction (committed at `_flush`); returns how many rows changed."""
        applied = 0
        fresh = self._unflushed
        self.store.begin()
        try:
            for change in changes:
                held = self.entries.get((owner, change.table, change.key))
                if held is not None and held.seq >= change.seq:
                    self.stats["stale_rows"] += 1
                    continue
                model = self._validate(owner, region, change)
                if model is False:
                    continue
                entry = Entry(owner, change.seq, model if isinstance(model, Row) else None)
                self._index(owner, change.table, change.key, entry)
                lseq = self.store.put(owner, change.table, change.key, change.seq, change.row)
                fresh.append(
                    RowChange(
                        lseq=lseq,
                        table=change.table,
                        key=change.key,
                        owner=owner,
                        seq=change.seq,
                        row=change.row,
                    )
                )
                applied += 1
            if advance is not None:
                self._advance(owner, *advance)
        finally:
            self._flush_soon()
        self.stats["applied"] += applied
        return applied

    def _flush_soon(self) -> None:
        if self._flush_at is not None:
            return
        try:
            self._flush_at = asyncio.get_running_loop().call_soon(self._flush)
        except RuntimeError:  # no loop: nothing else can join the transaction
            self._flush()

    def _flush(self) -> None:
        """Commits every batch applied in this turn of the event loop at once (a commit was the
        largest part of a batch's cost), then tells subscribers: they only ever hear of a change
        that is committed, so one they resume from is never lost."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        self.store.commit()
        fresh, self._unflushed = self._unflushed, []
        for rc in fresh:
            for queue in self._listeners:
                queue.put_nowait(rc)

    def _validate(self, owner: str, region: str, change: Change) -> Row | bool | None:
        """The row as a model, None for a deletion, False if it was quarantined."""
        model_type = TABLES.get(change.table)
        error = None
        model: Row | None = None
        if model_type is None:
            error = f"unknown table {change.table!r}"
        elif change.row is not None:
            try:
                model = model_type.model_validate(change.row)
            except ValidationError as exc:
                error = f"invalid row: {exc.errors(include_url=False)}"[:2000]
            else:
                error = _ownership_error(owner, region, change.key, model)
        if error is None:
            return model
        if self.store.quarantine(owner, change.table, change.key, change.seq, change.row, error):
            self.stats["quarantined"] += 1
            log.warning("quarantined %s/%s from %s: %s", change.table, change.key, owner, error)
        return False

    def _index(self, owner: str, table: str, key: str, entry: Entry | None) -> None:
        if entry is None:
            self.entries.pop((owner, table, key), None)
        else:
            self.entries[(owner, table, key)] = entry
        row = entry.row if entry else None
        if table == "workers":
            was = self._workers.pop(key, None)
            if was is not None:
                self._in_region[was.region].pop(key, None)
            if isinstance(row, WorkerRow):
                self._workers[key] = row
                self._in_region[row.region][key] = row
        elif table == "machines":
            old = self._machines.pop(key, None)
            if old is not None:
                self._by_app[old.app].discard(key)
            if isinstance(row, MachineRow):
                self._machines[key] = row
                self._by_app[row.app].add(key)
        elif table == "images":
            if isinstance(row, ImageRow):
                self._images[owner][key] = row
            else:
                self._images[owner].pop(key, None)
        elif table == "apps":
            if isinstance(row, AppRow):
                self._apps[key] = row
            else:
                self._apps.pop(key, None)
        elif table == "revocations":
            if isinstance(row, RevocationRow):
                self._revoked.add(key)
            else:
                self._revoked.discard(key)

    # --- messages ------------------------------------------------------------------------------

    async def _on_batch(self, msg: Message) -> None:
        try:
            batch = decode_batch(msg.data)
        except ProtocolError as exc:
            self.stats["bad_messages"] += 1
            log.warning("dropped a malformed batch: %s", exc)
            return
        if not self.follows(batch.region):
            return
        st = self._owner(batch.owner, batch.region, batch.epoch)
        if st is None:
            return
        self.stats["batches"] += 1
        self._heard(st, batch.head)
        contiguous = batch.prev <= st.head and not self.bootstrapping
        self._apply(
            batch.owner, batch.region, batch.changes, (st, batch.head) if contiguous else None
        )
        if not contiguous:
            self.stats["gaps"] += 1
            self._maybe_pull(batch.owner)

    def _advance(self, owner: str, st: OwnerState, head: int) -> None:
        if head > st.head:
            st.head = head
            self.store.save_owner(owner, st.region, st.epoch, head)

    async def _on_beat(self, msg: Message) -> None:
        try:
            beat = decode_heartbeat(msg.data)
        except ProtocolError as exc:
            self.stats["bad_messages"] += 1
            log.warning("dropped a malformed heartbeat: %s", exc)
            return
        st = self._owner(beat.owner, beat.region, beat.epoch)
        if st is None:
            return
        self._heard(st, beat.head)
        st.apps = beat.apps
        if st.seen > st.head and not st.checking:
            # Batches travel on another subscription and may be just behind this heartbeat:
            # pull only if they have not closed the distance after a moment.
            st.checking = True
            asyncio.get_running_loop().call_later(BEAT_GRACE, self._recheck, beat.owner, st)

    def _recheck(self, owner: str, st: OwnerState) -> None:
        st.checking = False
        if self._subs:  # still running
            self._maybe_pull(owner)

    def _maybe_pull(self, owner: str) -> None:
        st = self.owners.get(owner)
        if st is None or st.pulling or self.bootstrapping or not self.follows(st.region):
            return
        if st.seen > st.head:
            st.pulling = True
            self._spawn(self._pull(owner, st))

    async def _pull(self, owner: str, st: OwnerState) -> None:
        try:
            while self.owners.get(owner) is st:
                self.stats["pulls"] += 1
                request = encode(PullRequest(since=st.head))
                try:
                    data = await self.bus.request(pull_subject(owner), request, self.pull_timeout)
                    reply = decode_pull_reply(data)
                except (TimeoutError, ProtocolError) as exc:
                    self.stats["pull_failures"] += 1
                    log.debug("pull from %s failed: %s", owner, exc)
                    return  # the next heartbeat tries again
                current = self._owner(owner, reply.region, reply.epoch)
                if current is None:
                    return
                self._heard(current, reply.head)
                self._apply(owner, reply.region, reply.changes, (current, reply.head))
                if current is not st or not reply.more:
                    return
        finally:
            st.pulling = False

    # --- snapshots -------------------------------------------------------------------------

    async def _bootstrap(self, timeout: float) -> None:
        """Rows and heads from whichever replica answers first; then catch up by pulling."""
        self.bootstrapping = True
        inbox = self.bus.new_inbox()
        chunks: list[SnapshotChunk] = []
        done = asyncio.Event()

        async def on_chunk(msg: Message) -> None:
            try:
                chunk = decode_snapshot_chunk(msg.data)
            except ProtocolError:
                return
            if chunks and chunk.replica != chunks[0].replica:
                return  # another replica answered too; the first one wins
            if chunk.index != len(chunks):
                done.set()  # a chunk went missing: give up on this snapshot
                return
            chunks.append(chunk)
            if chunk.last:
                done.set()

        sub = await self.bus.subscribe(inbox, on_chunk)
        try:
            regions = None if self.regions is None else sorted(self.regions)
            await self.bus.publish(SNAPSHOT, _json({"regions": regions}), reply=inbox)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout)
        finally:
            await sub.unsubscribe()
            self.bootstrapping = False
        if not chunks or not chunks[-1].last:
            log.info("no snapshot (answered: %d chunks); catching up from owners", len(chunks))
            return
        by_owner: dict[str, list[Change]] = defaultdict(list)
        for chunk in chunks:
            for owner, change in chunk.changes:
                by_owner[owner].append(change)
        for owner, (region, epoch, head) in chunks[-1].heads.items():
            st = self._owner(owner, region, epoch)
            if st is None:
                continue
            st.seen = max(st.seen, head)
            self._apply(owner, region, by_owner.pop(owner, []), (st, head))
        self.stats["snapshots_loaded"] += 1
        log.info("bootstrapped from %s: %d owners", chunks[0].replica, len(chunks[-1].heads))

    async def _on_snapshot_request(self, msg: Message) -> None:
        if not msg.reply or self.bootstrapping:
            return
        try:
            wanted = _loads(msg.data).get("regions")
        except ValueError:
            return
        if self.regions is not None and (wanted is None or not set(wanted) <= self.regions):
            return  # we do not hold everything asked for
        owners = {o: st for o, st in self.owners.items() if wanted is None or st.region in wanted}
        live = [
            (e.owner, Change(t, k, e.seq, e.row.model_dump(mode="json")))
            for (o, t, k), e in self.entries.items()
            if o in owners and e.row is not None
        ]
        pieces = [live[i : i + SNAPSHOT_CHUNK] for i in range(0, len(live), SNAPSHOT_CHUNK)] or [[]]
        heads = {o: (st.region, st.epoch, st.head) for o, st in owners.items()}
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            chunk = SnapshotChunk(self.name, i, last, heads if last else {}, piece)
            await self.bus.publish(msg.reply, encode(chunk))
        self.stats["snapshots_served"] += 1

    # --- queries -----------------------------------------------------------------------------

    def reachable(self, owner: str) -> bool:
        st = self.owners.get(owner)
        return st is not None and time.monotonic() - st.heard <= self.unreachable_after

    def _worker_view(self, row: WorkerRow) -> WorkerRow:
        st = self.owners.get(row.id)
        return row.model_copy(
            update={
                "unreachable": not self.reachable(row.id),
                "last_heartbeat": st.heard_wall if st else None,
            }
        )

    def workers(self, region: str | None = None, reachable_only: bool = True) -> list[WorkerRow]:
        rows = self._workers if region is None else self._in_region.get(region, {})
        return [
            self._worker_view(w)
            for w in rows.values()
            if not reachable_only or self.reachable(w.id)
        ]

    def placeable(self, region: str) -> list[WorkerRow]:
        heard_since = time.monotonic() - self.unreachable_after  # `reachable`, once per call
        owners = self.owners
        return [
            w
            for w in self._in_region.get(region, {}).values()
            if (st := owners.get(w.id)) is not None and st.heard >= heard_since
        ]

    def worker(self, worker_id: str) -> WorkerRow | None:
        row = self._workers.get(worker_id)
        return None if row is None else self._worker_view(row)

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]:
        ids = self._by_app.get(app, set()) if app is not None else self._machines.keys()
        rows = (self._machines[i] for i in ids)
        return [m for m in rows if region is None or m.region == region]

    def machine(self, machine_id: str) -> MachineRow | None:
        return self._machines.get(machine_id)

    def image_cached(self, worker_id: str, image: str) -> bool:
        held = self._images.get(worker_id, {})
        return image in held or any(row.ref == image for row in held.values())

    def regions_of_app(self, app: str) -> list[str]:
        """From the rows held (followed regions, current to the millisecond) and from heartbeats
        (every region, current to the second)."""
        held = {m.region for m in self.machines(app=app) if m.state != "destroyed"}
        return sorted(held | {st.region for st in self.owners.values() if app in st.apps})

    def apps(self) -> list[AppRow]:
        return sorted(self._apps.values(), key=lambda a: a.name)

    def app(self, name: str) -> AppRow | None:
        return self._apps.get(name)

    def revoked(self, token_id: str) -> bool:
        return token_id in self._revoked

    def head(self, owner: str) -> int:
        st = self.owners.get(owner)
        return st.head if st else 0

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "replica": self.name,
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
                }
                for o, st in sorted(self.owners.items())
            ],
            "quarantined": self.store.quarantined(),
            "stats": dict(self.stats),
        }

    async def subscribe(
        self, tables: frozenset[str] | None = None, since: int | None = None
    ) -> AsyncGenerator[RowChange, None]:
        """Changes as they are applied. With `since`, first replays what this replica applied
        after it (from its log); `ResyncNeeded` if that part of the log is gone."""
        queue: asyncio.Queue[RowChange] = asyncio.Queue()
        self._listeners.append(queue)
        try:
            last = self.store.last_change() if since is None else since
            if since is not None:
                oldest = self.store.oldest_change()
                if oldest and since < oldest - 1:
                    raise ResyncNeeded(oldest)
                while True:
                    page = self.store.changes_after(last)
                    if not page:
                        break
                    for lseq, owner, table, key, seq, row in page:
                        last = lseq
                        if tables is None or table in tables:
                            yield RowChange(
                                lseq=lseq, table=table, key=key, owner=owner, seq=seq, row=row
                            )
            while True:
                rc = await queue.get()
                if rc.lseq <= last:
                    continue
                last = rc.lseq
                if tables is None or rc.table in tables:
                    yield rc
        finally:
            self._listeners.remove(queue)


@contextlib.asynccontextmanager
async def following(
    bus: Bus,
    path: Path | str = ":memory:",
    regions: list[str] | None = None,
    bootstrap: bool = True,
    settle: float = 2.0,
) -> AsyncIterator[Replica]:
    """A started replica, caught up with the owners that answer within `settle` seconds,
    stopped on exit. `bootstrap=False` where no other replica can exist yet (a single-process
    cluster), to skip waiting for a snapshot nobody will send."""
    replica = Replica(bus, path, regions)
    await replica.start(bootstrap=bootstrap)
    await replica.caught_up(settle)
    try:
        yield replica
    finally:
        await replica.stop()


class ResyncNeeded(Exception):
    """The subscriber's position is older than the replica's change log: read rows afresh."""

    def __init__(self, oldest: int) -> None:
        super().__init__(f"changes before {oldest} are no longer kept; read the rows afresh")
        self.oldest = oldest


def _ownership_error(owner: str, region: str, key: str, row: Row) -> str | None:
    """An owner may only write its own rows, and a row's key must be its identity."""
    if isinstance(row, WorkerRow) and (row.id != owner or row.id != key or row.region != region):
        return f"worker row {row.id!r} published by {owner!r} in {region!r}"
    if isinstance(row, MachineRow) and (row.worker_id != owner or row.id != key):
        return f"machine row {row.id!r} on {row.worker_id!r} published by {owner!r}"
    if isinstance(row, ImageRow) and (row.worker_id != owner or row.digest != key):
        return f"image row {row.digest!r} of {row.worker_id!r} published by {owner!r}"
    if isinstance(row, AppRow) and (owner != REGISTRY_OWNER or row.name != key):
        return f"app row {row.name!r} published by {owner!r}, not the app registry"
    if isinstance(row, RevocationRow) and (owner != REGISTRY_OWNER or row.id != key):
        return f"revocation {row.id!r} published by {owner!r}, not the app registry"
    return None


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _loads(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value

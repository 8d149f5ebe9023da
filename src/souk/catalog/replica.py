"""A replica: every followed owner's rows, kept current by sequence, queried from memory.

Rules that make it converge whatever the bus does (drop, duplicate, reorder):
- a row version is applied only if its owner sequence is newer than the one held, so duplicates
  and stale copies are no-ops and deletions leave a versioned tombstone;
- an owner's `head` here only advances over contiguous history (a batch whose `prev` we have, or
  a pull reply); a gap, or a heartbeat announcing a higher head, triggers a pull;
- a newer epoch (the owner's database was recreated) replaces all of that owner's rows; an
  older one is a late message from before, and is dropped.
Rows are validated with the shared models before they are applied; a row that fails is
quarantined and reported, and the rest of its batch still applies. With a `Trust`, nothing is
applied before its owner's signature checks out (`souk.catalog.guard`), and every row and head is
kept with the owner's proof, so that a snapshot relays the owners' word, not this replica's.
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
from collections import defaultdict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
from pydantic import ValidationError

from souk.catalog.bus import Bus, Message, Subscription
from souk.catalog.connecting import link_state
from souk.catalog.guard import Guard
from souk.catalog.protocol import (
    GLOBAL_REGION,
    HELLO,
    REGISTRY_OWNER,
    SNAPSHOT,
    WILDCARD,
    Batch,
    Change,
    HeadClaim,
    Heartbeat,
    ProtocolError,
    PullRequest,
    SnapshotChunk,
    cert_subject,
    changes_subject,
    decode_batch,
    decode_heartbeat,
    decode_pull_reply,
    decode_snapshot_chunk,
    encode,
    heartbeat_subject,
    pull_subject,
    subject_names,
)
from souk.catalog.signing import Signed, b64, row_text
from souk.catalog.store import ReplicaStore
from souk.catalog.trust import Refused, Trust
from souk.logsetup import about
from souk.models.catalog import (
    AppRow,
    ImageRow,
    MachineRow,
    RevocationRow,
    Row,
    RowChange,
    VolumeRow,
    WorkerRow,
)

log = logging.getLogger("souk.catalog.replica")

TABLES: dict[str, type[Row]] = {
    "workers": WorkerRow,
    "machines": MachineRow,
    "images": ImageRow,
    "volumes": VolumeRow,
    "apps": AppRow,
    "revocations": RevocationRow,
}
UNREACHABLE_AFTER = 3.0
PULL_TIMEOUT = 2.0
BEAT_GRACE = 0.25  # how long a heartbeat's news may run ahead of its batches before a pull
SNAPSHOT_CHUNK = 1000  # rows, heads or certificates per chunk: each well under NATS's 1 MB
CERT_RETRY = 1.0  # seconds between two requests for one owner's certificate
_ids = itertools.count(1)
_Sent = TypeVar("_Sent", Batch, Heartbeat)  # what an owner publishes on its own subjects


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
    unchecked: Heartbeat | None = None  # a beat whose head counts once its signature does


@dataclass
class Placeable:
    """A region's workers as placement reads them, built once and then changed row by row as
    their owners change them, fall silent or speak again: `rows` the reachable ones (what
    `Replica.placeable` hands out), `left_out` the ids of the others (`Replica.silent`). Reading
    a region of 10,000 workers afresh for every create cost more than the rest of the decision,
    and rebuilding it whenever an owner might have fallen silent was a 15 ms stall at 10,000
    workers every two seconds or so, in whichever create met it."""

    rows: list[WorkerRow]
    pos: dict[str, int]
    left_out: set[str]

    def put(self, row: WorkerRow, reachable: bool) -> None:
        """A row changed or arrived: replaced in place if held, else added where it belongs."""
        at = self.pos.get(row.id)
        if at is not None:
            self.rows[at] = row
        elif reachable:
            self.reach(row)
        else:
            self.left_out.add(row.id)

    def reach(self, row: WorkerRow) -> None:
        if row.id not in self.pos:
            self.pos[row.id] = len(self.rows)
            self.rows.append(row)
        self.left_out.discard(row.id)

    def leave_out(self, key: str) -> None:
        self.drop(key)
        self.left_out.add(key)

    def drop(self, key: str) -> None:
        self.left_out.discard(key)
        at = self.pos.pop(key, None)
        if at is None:
            return
        last = self.rows.pop()
        if at < len(self.rows):  # the last row takes the removed one's place
            self.rows[at] = last
            self.pos[last.id] = at


class Replica:
    def __init__(
        self,
        bus: Bus,
        path: Path | str = ":memory:",
        regions: list[str] | None = None,
        unreachable_after: float = UNREACHABLE_AFTER,
        name: str | None = None,
        pull_timeout: float = PULL_TIMEOUT,
        trust: Trust | None = None,
    ) -> None:
        """`trust`: whom to believe; None makes an insecure replica, which applies unsigned
        rows (`souk dev`, tests), while one with a `Trust` refuses anything unsigned."""
        self.bus = bus
        self.regions = set(regions) if regions else None
        self.unreachable_after = unreachable_after
        self.pull_timeout = pull_timeout
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{next(_ids)}"
        self.store = ReplicaStore(path)
        self.owners: dict[str, OwnerState] = {}
        # (owner, table, key) -> the version held, a deleted row's too; the rows themselves are
        # in the tables' indexes below, once each (fewer objects for the collector to walk)
        self.versions: dict[tuple[str, str, str], int] = {}
        self._workers: dict[str, WorkerRow] = {}
        self._in_region: dict[str, dict[str, WorkerRow]] = defaultdict(dict)
        self._placeable: dict[str, Placeable] = {}  # placement reads it, see `placeable`
        # every sign of life in the last `unreachable_after`, oldest first: when (monotonic) and
        # whose; an owner whose last one leaves has fallen silent (see `_expire`). Two queues,
        # not one of pairs: a number and a name are no objects for the collector to walk.
        self._beat_times: deque[float] = deque()
        self._beat_owners: deque[str] = deque()
        self._machines: dict[str, MachineRow] = {}
        self._by_app: dict[str, set[str]] = defaultdict(set)
        self._images: dict[str, dict[str, ImageRow]] = defaultdict(dict)
        # image (digest, or the reference it was pulled as) -> its holders, each with how many
        # of its rows name it (a tag pulled again under a new digest is a second row)
        self._holders: dict[str, dict[str, int]] = {}
        self._volumes: dict[str, VolumeRow] = {}
        self._apps: dict[str, AppRow] = {}
        self._revoked: dict[str, RevocationRow] = {}
        self._subs: list[Subscription] = []
        self._listeners: list[asyncio.Queue[RowChange]] = []
        self._unflushed: list[RowChange] = []  # applied, to commit and announce at `_flush`
        self._flush_at: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.bootstrapping = False
        self.ready = asyncio.Event()
        self.stats: dict[str, int] = defaultdict(int)
        self.on_apply: Callable[[float], None] | None = None  # told each apply's seconds
        self.guard = Guard(trust, self._want_cert, self.store.save_cert)
        self._cert_asked: dict[str, float] = {}
        self._hello_at = -CERT_RETRY
        self._load()

    # --- lifecycle -------------------------------------------------------------------------

    def _load(self) -> None:
        if self.guard.trust is not None:
            for der in self.store.certs().values():
                with contextlib.suppress(Refused):  # expired since: no longer trusted
                    self.guard.trust.learn(der)
        for owner, region, epoch, head in self.store.owners():
            self.owners[owner] = OwnerState(region, epoch, head, head)
        for owner, table, key, seq, row in self.store.all_rows():
            model = None if row is None else TABLES[table].model_validate(row)
            self._index(owner, table, key, seq, model)

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
        self._hello_at = time.monotonic()
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
        for key in [k for k in self.versions if k[0] == owner]:
            self._index(owner, key[1], key[2], None, None)
        self.store.drop_owner(owner)
        new = OwnerState(region, epoch)  # its head proof goes with the rows
        new.heard, new.heard_wall, new.apps = st.heard, st.heard_wall, st.apps
        self.owners[owner] = new
        self.store.save_owner(owner, region, epoch, 0)
        return new

    def _heard(self, owner: str, st: OwnerState, head: int) -> None:
        """An owner's sign of life: memory only, never a write (a heartbeat that brings no news
        costs a replica no SQLite statement, 1,000 times a second at 1,000 owners)."""
        now = time.monotonic()
        was_silent = st.heard < now - self.unreachable_after
        st.heard = now
        st.heard_wall = time.time()
        if head > st.seen:
            st.seen = head
        if was_silent and (row := self._workers.get(owner)) is not None:
            self._place(owner, row)  # reachable again: back among the placeable rows
        self._beat_times.append(now)
        self._beat_owners.append(owner)
        self._expire(now)

    def _expire(self, now: float) -> None:
        """Takes the owners that have fallen silent out of the placeable rows: those whose last
        sign of life is older than `unreachable_after`. One step per sign of life, in the order
        they came, so silence costs what the heartbeats already cost, never a region's scan."""
        times, since = self._beat_times, now - self.unreachable_after
        while times and times[0] < since:
            heard, owner = times.popleft(), self._beat_owners.popleft()
            st = self.owners.get(owner)
            row = self._workers.get(owner)
            if st is None or st.heard != heard or row is None:
                continue  # heard from since (a later sign of life is queued), or no worker row
            held = self._placeable.get(row.region)
            if held is not None:
                held.leave_out(owner)

    def _apply(
        self,
        owner: str,
        region: str,
        changes: list[Change],
        advance: tuple[OwnerState, int, bytes | None] | None = None,
        signed: Signed | None = None,
        proofs: list[tuple[bytes, bytes]] | None = None,
    ) -> int:
        """Applies what is newer than held, and moves the owner's head to `advance` (state,
        head, the owner's proof of it) in the same transaction (committed at `_flush`); returns
        how many rows changed. Each row is stored with its owner's proof: from the message it
        came in (`signed`), or as relayed (`proofs`: (row text, proof) per change)."""
        applied, began = 0, time.perf_counter()
        fresh = self._unflushed
        self.store.begin()
        try:
            for i, change in enumerate(changes):
                held = self.versions.get((owner, change.table, change.key))
                if held is not None and held >= change.seq:
                    self.stats["stale_rows"] += 1
                    continue
                model = self._validate(owner, region, change)
                if model is False:
                    continue
                row = model if isinstance(model, Row) else None
                self._index(owner, change.table, change.key, change.seq, row)
                text = proof = None
                if signed is not None:
                    text, proof = signed.texts[i], signed.row_proof(i)
                elif proofs is not None:
                    text, proof = proofs[i]
                lseq = self.store.put(
                    owner, change.table, change.key, change.seq, change.row, text, proof
                )
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
        if self.on_apply is not None:
            self.on_apply(time.perf_counter() - began)
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
            log.warning(
                "quarantined %s/%s from %s: %s",
                change.table,
                change.key,
                owner,
                error,
                extra=about(change.key, "quarantined", kind=change.table, owner=owner),
            )
        return False

    def _index(self, owner: str, table: str, key: str, seq: int | None, row: Row | None) -> None:
        """Holds `row` (None: deleted) at version `seq` (None: forgotten, with its owner's
        epoch)."""
        if seq is None:
            self.versions.pop((owner, table, key), None)
        else:
            self.versions[(owner, table, key)] = seq
        if table == "workers":
            was = self._workers.pop(key, None)
            new = row if isinstance(row, WorkerRow) else None
            if was is not None:
                self._in_region[was.region].pop(key, None)
                if new is None or new.region != was.region:
                    self._unplace(was.region, key)
            if new is not None:
                self._workers[key] = new
                self._in_region[new.region][key] = new
                self._place(key, new)
        elif table == "machines":
            old = self._machines.pop(key, None)
            if old is not None:
                self._by_app[old.app].discard(key)
            if isinstance(row, MachineRow):
                self._machines[key] = row
                self._by_app[row.app].add(key)
        elif table == "images":
            was_image = self._images[owner].pop(key, None)
            if was_image is not None:
                self._hold(owner, was_image, -1)
            if isinstance(row, ImageRow):
                self._images[owner][key] = row
                self._hold(owner, row, 1)
        elif table == "volumes":
            if isinstance(row, VolumeRow):
                self._volumes[key] = row
            else:
                self._volumes.pop(key, None)
        elif table == "apps":
            if isinstance(row, AppRow):
                self._apps[key] = row
            else:
                self._apps.pop(key, None)
        elif table == "revocations":
            if isinstance(row, RevocationRow):
                self._revoked[key] = row
            else:
                self._revoked.pop(key, None)

    def _hold(self, owner: str, row: ImageRow, step: int) -> None:
        for name in {row.digest, row.ref} - {""}:
            holders = self._holders.setdefault(name, {})
            count = holders.get(owner, 0) + step
            if count > 0:
                holders[owner] = count
            else:
                holders.pop(owner, None)
                if not holders:
                    del self._holders[name]

    # --- messages ------------------------------------------------------------------------------

    def _received(self, msg: Message, decode: Callable[[bytes], _Sent], what: str) -> _Sent | None:
        """A batch or heartbeat, decoded, if it came on its owner's own subject."""
        try:
            sent = decode(msg.data)
        except ProtocolError as exc:
            self.stats["bad_messages"] += 1
            log.warning("dropped a malformed %s: %s", what, exc)
            return None
        if subject_names(msg.subject) != (sent.region, sent.owner):
            self.guard.refuse(Refused("wrong_subject"), f"a {what} on {msg.subject}")
            return None
        return sent

    async def _on_batch(self, msg: Message) -> None:
        batch = self._received(msg, decode_batch, "batch")
        if batch is None or not self.follows(batch.region):
            return
        signed = None
        if self.guard.secure:
            try:
                signed = self.guard.batch(batch)
            except Refused as exc:
                self.guard.refuse(exc, f"a batch of {batch.owner!r}")
                return
        st = self._owner(batch.owner, batch.region, batch.epoch)
        if st is None:
            return
        self.stats["batches"] += 1
        contiguous = batch.prev <= st.head and not self.bootstrapping
        self._take(batch.owner, st, batch.region, batch.head, batch.changes, signed, contiguous)
        if not contiguous:
            self.stats["gaps"] += 1
            self._maybe_pull(batch.owner)

    def _take(
        self,
        owner: str,
        st: OwnerState,
        region: str,
        head: int,
        changes: list[Change],
        signed: Signed | None,
        contiguous: bool,
    ) -> None:
        """Applies a batch or pull reply that reaches `head`, moving the owner's head there if
        it follows on from what is held (`contiguous`)."""
        if signed is None or head > st.head:
            self._heard(owner, st, head)  # signed: an old message replayed is no sign of life
        proof = None if signed is None else signed.head_proof()
        self._apply(owner, region, changes, (st, head, proof) if contiguous else None, signed)

    def _advance(self, owner: str, st: OwnerState, head: int, proof: bytes | None) -> None:
        if head > st.head:
            st.head = head
            self.store.save_owner(owner, st.region, st.epoch, head, proof)

    async def _on_beat(self, msg: Message) -> None:
        beat = self._received(msg, decode_heartbeat, "heartbeat")
        if beat is None:
            return
        checked = True
        if self.guard.secure:
            held = self.owners.get(beat.owner)
            applied = held.head if held is not None and held.epoch == beat.epoch else None
            try:
                checked = self.guard.beat(beat, applied)
            except Refused as exc:
                self.guard.refuse(exc, f"a heartbeat of {beat.owner!r}")
                return
        st = self._owner(beat.owner, beat.region, beat.epoch)
        if st is None:
            return
        self._heard(beat.owner, st, beat.head if checked else 0)
        if not checked:
            st.unchecked = beat
        if beat.apps != st.apps:  # else the held list stays: replaced at every heartbeat,
            st.apps = beat.apps  # it was a new object a second per owner for the collector
        if (st.seen > st.head or st.unchecked) and not st.checking:
            # Batches travel on another subscription and may be just behind this heartbeat:
            # pull only if they have not closed the distance after a moment.
            st.checking = True
            asyncio.get_running_loop().call_later(BEAT_GRACE, self._recheck, beat.owner, st)

    def _recheck(self, owner: str, st: OwnerState) -> None:
        st.checking = False
        beat, st.unchecked = st.unchecked, None
        if beat is not None and beat.head > st.head and self.owners.get(owner) is st:
            try:
                self.guard.beat_signature(beat)
            except Refused as exc:
                self.guard.refuse(exc, f"a heartbeat of {owner!r}")
            else:
                st.seen = max(st.seen, beat.head)
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
                since = st.head
                request = encode(PullRequest(since=since))
                try:
                    data = await self.bus.request(pull_subject(owner), request, self.pull_timeout)
                    reply = decode_pull_reply(data)
                except (TimeoutError, ProtocolError) as exc:
                    self.stats["pull_failures"] += 1
                    log.debug("pull from %s failed: %s", owner, exc)
                    return  # the next heartbeat tries again
                signed = None
                if self.guard.secure:
                    try:
                        signed = self.guard.pull_reply(owner, reply)
                    except Refused as exc:
                        self.guard.refuse(exc, f"a pull reply for {owner!r}")
                        self.stats["pull_failures"] += 1
                        return
                if reply.owner != owner or reply.since > since:
                    self.stats["pull_failures"] += 1  # not an answer to this request
                    return
                current = self._owner(owner, reply.region, reply.epoch)
                if current is None:
                    return
                self._take(owner, current, reply.region, reply.head, reply.changes, signed, True)
                if current is not st or not reply.more:
                    return
        finally:
            st.pulling = False

    # --- certificates ---------------------------------------------------------------------

    def _want_cert(self, owner: str) -> None:
        """An owner signed with a certificate we do not know: ask it for it (not too often, and
        not right after our hello, which every owner answers with its certificate)."""
        now = time.monotonic()
        if now - self._cert_asked.get(owner, -CERT_RETRY) < CERT_RETRY or not self._subs:
            return
        if now - self._hello_at < CERT_RETRY:
            return
        self._cert_asked[owner] = now
        self._spawn(self._fetch_cert(owner))

    async def _fetch_cert(self, owner: str) -> None:
        try:
            data = await self.bus.request(cert_subject(owner), b"{}", self.pull_timeout)
            cert = str(_loads(data)["cert"])
        except (TimeoutError, ValueError, KeyError) as exc:
            log.debug("no certificate from %s: %s", owner, exc)
            return
        try:
            self.guard.learn(cert)
        except Refused as exc:
            self.guard.refuse(exc, f"the certificate {owner!r} sent")
            return
        self._maybe_pull(owner)

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
        heads: dict[str, HeadClaim] = {}
        by_owner: dict[str, list[tuple[Change, list[Any] | None]]] = defaultdict(list)
        for chunk in chunks:
            heads.update(chunk.heads)
            for owner, change, proof in chunk.changes:
                by_owner[owner].append((change, proof))
            if self.guard.secure:
                for cert in chunk.certs.values():
                    try:
                        self.guard.learn(cert)
                    except Refused as exc:
                        self.guard.refuse(exc, "a relayed certificate")
        for owner, claim in heads.items():
            self._load_relayed(owner, claim, by_owner.pop(owner, []))
        self.stats["snapshots_loaded"] += 1
        log.info("bootstrapped from %s: %d owners", chunks[0].replica, len(heads))

    def _load_relayed(
        self, owner: str, claim: HeadClaim, rows: list[tuple[Change, list[Any] | None]]
    ) -> None:
        """An owner's rows and head from a snapshot. Signed: what fails its owner's proof is
        refused, and an owner with any refused row keeps head 0, so it is pulled from the owner
        in full."""
        proofs: list[tuple[bytes, bytes]] | None = None
        head_proof = None
        changes = [change for change, _ in rows]
        complete = True
        if self.guard.secure:
            try:
                self.guard.relayed_head(owner, claim.region, claim.epoch, claim.head, claim.proof)
            except Refused as exc:
                self.guard.refuse(exc, f"the relayed head of {owner!r}")
                return
            head_proof = orjson.dumps(claim.proof)
            changes, proofs = [], []
            for change, proof in rows:
                text = row_text(change.row)
                try:
                    self.guard.relayed_row(owner, claim.epoch, change, text, proof)
                except Refused as exc:
                    self.guard.refuse(exc, f"a relayed row of {owner!r}")
                    complete = False
                    continue
                changes.append(change)
                proofs.append((text, orjson.dumps(proof)))
        st = self._owner(owner, claim.region, claim.epoch)
        if st is None:
            return
        st.seen = max(st.seen, claim.head)
        advance = (st, claim.head, head_proof) if complete else None
        self._apply(owner, claim.region, changes, advance, proofs=proofs)

    async def _on_snapshot_request(self, msg: Message) -> None:
        if not msg.reply or self.bootstrapping:
            return
        try:
            wanted = _loads(msg.data).get("regions")
        except ValueError:
            return
        if self.regions is not None and (wanted is None or not set(wanted) <= self.regions):
            return  # we do not hold everything asked for
        owners = {
            o: st
            for o, st in self.owners.items()
            if wanted is None or st.region in wanted or st.region == GLOBAL_REGION
        }
        self._flush()  # what is read below is what is committed
        secure = self.guard.secure
        proofs = self.store.head_proofs() if secure else {}
        rows: list[Any] = [
            [
                o,
                {"table": t, "key": k, "seq": seq, "row": orjson.Fragment(text)},
                _fragment(p) if secure else None,
            ]
            for o, t, k, seq, text, p in self.store.live_rows(set(owners))
        ]
        heads: list[Any] = [
            (
                o,
                {
                    "region": st.region,
                    "epoch": st.epoch,
                    "head": st.head,
                    "proof": _fragment(proofs.get(o)) if secure else None,
                },
            )
            for o, st in owners.items()
            # Signed, a head is relayed with the header that brought it; one known only from
            # heartbeats (head 0) has none, and its recipient hears it from the owner anyway.
            if not secure or proofs.get(o) is not None
        ]
        certs = [(fp, b64(der)) for fp, der in self.store.certs().items()] if secure else []
        pieces: list[tuple[list[Any], list[Any], list[Any]]]
        pieces = [(piece, [], []) for piece in _pieces(rows)]
        pieces += [([], piece, []) for piece in _pieces(heads)]
        pieces += [([], [], piece) for piece in _pieces(certs)]
        pieces = pieces or [([], [], [])]
        for i, (some_rows, some_heads, some_certs) in enumerate(pieces):
            chunk = {
                "replica": self.name,
                "index": i,
                "last": i == len(pieces) - 1,
                "heads": dict(some_heads),
                "changes": some_rows,
                "certs": dict(some_certs),
            }
            await self.bus.publish(msg.reply, orjson.dumps(chunk))
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
        """The region's reachable workers, as held (see `CatalogView.placeable`): the list kept
        in `Placeable`, always the same object, so not to be modified, and to be read before
        the caller next yields."""
        return self._held(region).rows

    def _held(self, region: str) -> Placeable:
        self._expire(time.monotonic())
        held = self._placeable.get(region)
        if held is None:  # once per region
            held = self._placeable[region] = Placeable([], {}, set())
            for w in self._in_region.get(region, {}).values():
                held.put(w, self.reachable(w.id))
        return held

    def _place(self, key: str, row: WorkerRow) -> None:
        """A worker row changed: in place in its region's `Placeable`, or added to it (left out
        while its owner is unreachable)."""
        held = self._placeable.get(row.region)
        if held is not None:
            held.put(row, self.reachable(key))

    def _unplace(self, region: str, key: str) -> None:
        held = self._placeable.get(region)
        if held is not None:
            held.drop(key)

    def silent(self, region: str) -> list[WorkerRow]:
        """The region's workers not heard from lately (`placeable` leaves them out), as
        `workers()` shows them: only these are looked at and copied, usually none."""
        rows = self._in_region.get(region, {})
        return [self._worker_view(rows[key]) for key in self._held(region).left_out]

    def worker(self, worker_id: str) -> WorkerRow | None:
        row = self._workers.get(worker_id)
        return None if row is None else self._worker_view(row)

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]:
        ids = self._by_app.get(app, set()) if app is not None else self._machines.keys()
        rows = (self._machines[i] for i in ids)
        return [m for m in rows if region is None or m.region == region]

    def machine(self, machine_id: str) -> MachineRow | None:
        return self._machines.get(machine_id)

    def volumes(self, app: str | None = None) -> list[VolumeRow]:
        return [v for v in self._volumes.values() if app in (None, v.app)]

    def placeable_holding(self, region: str, image: str) -> list[WorkerRow]:
        """The region's placeable rows (as `placeable` holds them) of workers holding the
        image: looked up by image, so the region is never scanned for it."""
        holders = self._holders.get(image)
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
        return sorted(self._apps.values(), key=lambda a: a.name)

    def app(self, name: str) -> AppRow | None:
        return self._apps.get(name)

    def revoked(self, token_id: str) -> bool:
        return token_id in self._revoked

    def row(self, owner: str, table: str, key: str) -> Row | None:
        """The row of `owner` held under `key` in `table`, None if none is (or it was deleted)."""
        if (owner, table, key) not in self.versions:
            return None
        if table == "images":
            return self._images.get(owner, {}).get(key)
        indexes: dict[str, dict[str, Any]] = {
            "workers": self._workers,
            "machines": self._machines,
            "volumes": self._volumes,
            "apps": self._apps,
            "revocations": self._revoked,
        }
        row: Row | None = indexes.get(table, {}).get(key)
        return row

    def head(self, owner: str) -> int:
        st = self.owners.get(owner)
        return st.head if st else 0

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
                }
                for o, st in sorted(self.owners.items())
            ],
            "quarantined": self.store.quarantined(),
            "security": "signed" if self.guard.secure else "insecure",
            "refused": dict(self.guard.refused),
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
    trust: Trust | None = None,
) -> AsyncIterator[Replica]:
    """A started replica, caught up with the owners that answer within `settle` seconds,
    stopped on exit. `bootstrap=False` where no other replica can exist yet (a single-process
    cluster), to skip waiting for a snapshot nobody will send. `trust`: see `Replica`."""
    replica = Replica(bus, path, regions, trust=trust)
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


def _pieces(items: list[Any]) -> list[list[Any]]:
    return [items[i : i + SNAPSHOT_CHUNK] for i in range(0, len(items), SNAPSHOT_CHUNK)]


def _fragment(text: str | None) -> orjson.Fragment | None:
    return None if text is None else orjson.Fragment(text)


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _loads(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value

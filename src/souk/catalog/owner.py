"""The owner's side of replication: publish each commit at once, heartbeat, answer pulls.

An owner is whatever writes rows (a worker); it exposes them through a `RowSource` and tells the
`Owner` about each commit. Publishing never waits for replicas and never blocks the commit: what a
replica misses it pulls later, by sequence. With a `Signer`, every batch, heartbeat and pull reply
it sends is signed with the owner's key (see `souk.catalog.signing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import orjson

from souk.catalog.bus import Bus, Message, Subscription
from souk.catalog.protocol import (
    HELLO,
    Batch,
    Change,
    Heartbeat,
    ProtocolError,
    PullReply,
    cert_subject,
    changes_subject,
    decode_pull_request,
    encode,
    heartbeat_subject,
    pull_subject,
)
from souk.catalog.signing import Signer, TickChain, b64, beat_statement, header_for
from souk.node.periodic import every

log = logging.getLogger("souk.catalog.owner")
HEARTBEAT_EVERY = 1.0
# What one batch may carry of rows, well under NATS's default max_payload (1 MiB), so that a
# burst of commits (or big rows) never makes a message the bus refuses: that would stall the
# owner's replication with nothing but a bus error to show for it.
BATCH_BYTES = 256 * 1024
# Rows whose last sent version an owner remembers, to send no version a replica already has.
REMEMBERED = 100_000


def split(changes: list[Change], head: int) -> list[tuple[int, list[Change]]]:
    """The changes of one publish as batches of at most `BATCH_BYTES` of rows each, in sequence
    order, each with the head it reaches (the last reaches `head`). A row bigger than that
    travels alone."""
    changes.sort(key=lambda c: c.seq)
    parts: list[tuple[int, list[Change]]] = []
    part: list[Change] = []
    size = 0
    for change in changes:
        row_size = len(orjson.dumps(change.row)) if change.row is not None else 0
        if part and size + row_size > BATCH_BYTES:
            parts.append((part[-1].seq, part))
            part, size = [], 0
        part.append(change)
        size += row_size
    parts.append((head, part))
    if len(parts) > 1:
        log.warning("a publish of %d changes split into %d batches", len(changes), len(parts))
    return parts


class RowSource(Protocol):
    """An owner's rows, versioned by its own sequence."""

    owner: str
    region: str
    epoch: str

    def head(self) -> int: ...

    def changes_since(self, since: int, limit: int) -> tuple[list[Change], int, bool]:
        """The current version of every row changed after `since` (deletions as `row=None`),
        oldest first, at most `limit`; with the head they bring a replica to, and whether more
        remain after it. From 0 too, every row a replica shows (deletions may be left out): a
        replica's head promises every row up to it, and its snapshots relay that promise."""
        ...

    def apps(self) -> list[str]:
        """Apps with live machines here, for the global app-to-regions index."""
        ...


@dataclass
class _Pending:
    head: int
    changes: list[Change]


class Owner:
    def __init__(
        self,
        bus: Bus,
        source: RowSource,
        heartbeat_every: float = HEARTBEAT_EVERY,
        signer: Signer | None = None,
    ) -> None:
        self.bus = bus
        self.source = source
        self.heartbeat_every = heartbeat_every
        self.signer = signer
        self.chain = TickChain() if signer is not None else None
        # The next batch carries the certificate: it may overtake the heartbeat that does.
        self._cert_due = signer is not None
        self.published = source.head()
        self._pending: list[_Pending] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[Subscription] = []
        self._sent: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self.batches = 0

    async def start(self) -> None:
        self._subs = [
            await self.bus.subscribe(pull_subject(self.source.owner), self._on_pull),
            await self.bus.subscribe(HELLO, self._on_hello),
        ]
        if self.signer is not None:
            self._subs.append(
                await self.bus.subscribe(cert_subject(self.source.owner), self._on_cert)
            )
        self._tasks = [
            asyncio.create_task(self._publisher()),
            asyncio.create_task(
                # read at each wait: a test may change it once started
                every(lambda: self.heartbeat_every, self.heartbeat, what="heartbeat", log=log)
            ),
        ]
        await self.heartbeat(with_cert=True)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sub in self._subs:
            await sub.unsubscribe()

    def committed(self, head: int, changes: Iterable[Change]) -> None:
        """Called once per commit, in commit order, with the rows it touched. A row that reads
        as it did when last sent is not sent again (a worker's commit that changes nothing a
        replica holds, such as a create's confirmation, is one message fewer for every replica
        and one signature fewer to check); a commit left with no row sends nothing, and the
        next batch's head moves past it."""
        news = [c for c in changes if self._news(c)]
        if news:
            self._pending.append(_Pending(head, news))
            self._wake.set()

    def _news(self, change: Change) -> bool:
        key = (change.table, change.key)
        if change.row is None:
            self._sent.pop(key, None)
            return True
        digest = hashlib.blake2b(orjson.dumps(change.row), digest_size=16).digest()
        if self._sent.get(key) == digest:
            return False
        self._sent[key] = digest
        self._sent.move_to_end(key)
        if len(self._sent) > REMEMBERED:  # forgotten: sent once more, if it ever repeats
            self._sent.popitem(last=False)
        return True

    async def _publisher(self) -> None:
        """Publishes what is pending at once; commits that land while a publish is in flight go
        out together in the next message, so a busy owner sends fewer, larger messages."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            pending, self._pending = self._pending, []
            if not pending:
                continue
            latest: dict[tuple[str, str], Change] = {}
            for item in pending:
                for change in item.changes:
                    held = latest.get((change.table, change.key))
                    if held is None or change.seq >= held.seq:
                        latest[(change.table, change.key)] = change
            head = max(self.published, pending[-1].head)
            for part_head, changes in split(list(latest.values()), head):
                await self._publish(part_head, changes)

    async def _publish(self, head: int, changes: list[Change]) -> None:
        src = self.source
        batch = Batch(src.owner, src.region, src.epoch, self.published, head, changes)
        if self.signer is not None:
            batch.fp, batch.sig = self._sign("batch", batch.prev, head, False, batch.changes)
            if self._cert_due:
                batch.cert, self._cert_due = b64(self.signer.certificate), False
        self.published = head
        self.batches += 1
        await self.bus.publish(changes_subject(src.region, src.owner), encode(batch))

    def _sign(
        self, kind: str, prev: int, head: int, more: bool, changes: list[Change]
    ) -> tuple[str, str]:
        assert self.signer is not None
        src, fp = self.source, self.signer.fingerprint
        header, _, _ = header_for(
            kind, src.owner, src.region, src.epoch, prev, head, more, changes, fp
        )
        return fp, b64(self.signer.sign(header.statement()))

    async def heartbeat(self, with_cert: bool = False) -> None:
        """Publishes a heartbeat now; `with_cert` adds the signing certificate, for replicas
        that have just started and may not know it."""
        src = self.source
        beat = Heartbeat(src.owner, src.region, src.epoch, self.published, src.apps())
        if self.signer is not None and self.chain is not None:
            beat.fp = self.signer.fingerprint
            beat.chain_at, beat.n, beat.tick = self.chain.next()
            beat.sig = b64(self.signer.sign(beat_statement(beat)))
            if with_cert:
                beat.cert = b64(self.signer.certificate)
        await self.bus.publish(heartbeat_subject(src.region, src.owner), encode(beat))

    async def _on_hello(self, _: Message) -> None:
        self._cert_due = self.signer is not None
        await self.heartbeat(with_cert=True)

    async def _on_cert(self, msg: Message) -> None:
        if msg.reply and self.signer is not None:
            answer = {"cert": b64(self.signer.certificate)}
            await self.bus.publish(msg.reply, orjson.dumps(answer))

    async def _on_pull(self, msg: Message) -> None:
        if not msg.reply:
            return
        try:
            req = decode_pull_request(msg.data)
        except ProtocolError as exc:
            log.warning("bad pull request: %s", exc)
            return
        changes, head, more = self.source.changes_since(req.since, req.limit)
        parts = split(changes, head)
        if len(parts) > 1:  # the rest in the next pull, as with a count limit
            (head, changes), more = parts[0], True
        src = self.source
        reply = PullReply(src.owner, src.region, src.epoch, head, more, changes, req.since)
        if self.signer is not None:
            reply.fp, reply.sig = self._sign("pull", req.since, head, more, changes)
        await self.bus.publish(msg.reply, encode(reply))

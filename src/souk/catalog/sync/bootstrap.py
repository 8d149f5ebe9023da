"""A fresh replica's start: rows and heads from whichever replica answers a snapshot request
first, then catching up from the owners by sequence. On a signed catalog every relayed row and
head is checked against its owner's proof: a replica can relay what owners wrote, never forge
it, and an owner with a refused row is pulled from the owner in full."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from typing import Any

import orjson

from souk.catalog.apply import Applier
from souk.catalog.bus import Bus, Message
from souk.catalog.guard import Guard
from souk.catalog.protocol import (
    SNAPSHOT,
    Change,
    HeadClaim,
    ProtocolError,
    SnapshotChunk,
    decode_snapshot_chunk,
)
from souk.catalog.signing import row_text
from souk.catalog.trust import Refused

log = logging.getLogger("souk.catalog.replica")


async def load_snapshot(bus: Bus, applier: Applier, guard: Guard, timeout: float) -> None:
    """Rows and heads from whichever replica answers first; then catch up by pulling."""
    applier.bootstrapping = True
    inbox = bus.new_inbox()
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

    sub = await bus.subscribe(inbox, on_chunk)
    try:
        regions = None if applier.regions is None else sorted(applier.regions)
        await bus.publish(SNAPSHOT, json.dumps({"regions": regions}).encode(), reply=inbox)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout)
    finally:
        await sub.unsubscribe()
        applier.bootstrapping = False
    if not chunks or not chunks[-1].last:
        log.info("no snapshot (answered: %d chunks); catching up from owners", len(chunks))
        return
    heads: dict[str, HeadClaim] = {}
    by_owner: dict[str, list[tuple[Change, list[Any] | None]]] = defaultdict(list)
    for chunk in chunks:
        heads.update(chunk.heads)
        for owner, change, proof in chunk.changes:
            by_owner[owner].append((change, proof))
        if guard.secure:
            for cert in chunk.certs.values():
                try:
                    guard.learn(cert)
                except Refused as exc:
                    guard.refuse(exc, "a relayed certificate")
    for owner, claim in heads.items():
        _load_relayed(applier, guard, owner, claim, by_owner.pop(owner, []))
    applier.stats["snapshots_loaded"] += 1
    log.info("bootstrapped from %s: %d owners", chunks[0].replica, len(heads))


def _load_relayed(
    applier: Applier,
    guard: Guard,
    owner: str,
    claim: HeadClaim,
    rows: list[tuple[Change, list[Any] | None]],
) -> None:
    """An owner's rows and head from a snapshot. Signed: what fails its owner's proof is
    refused, and an owner with any refused row keeps head 0, so it is pulled from the owner
    in full."""
    proofs: list[tuple[bytes, str]] | None = None
    head_proof = None
    changes = [change for change, _ in rows]
    complete = True
    if guard.secure:
        try:
            guard.relayed_head(owner, claim.region, claim.epoch, claim.head, claim.proof)
        except Refused as exc:
            guard.refuse(exc, f"the relayed head of {owner!r}")
            return
        head_proof = orjson.dumps(claim.proof).decode()
        changes, proofs = [], []
        for change, proof in rows:
            text = row_text(change.row)
            try:
                guard.relayed_row(owner, claim.epoch, change, text, proof)
            except Refused as exc:
                guard.refuse(exc, f"a relayed row of {owner!r}")
                complete = False
                continue
            changes.append(change)
            proofs.append((text, orjson.dumps(proof).decode()))
    st = applier.owner(owner, claim.region, claim.epoch)
    if st is None:
        return
    st.seen = max(st.seen, claim.head)
    advance = (st, claim.head, head_proof) if complete else None
    applier.apply(owner, claim.region, changes, advance, proofs=proofs)

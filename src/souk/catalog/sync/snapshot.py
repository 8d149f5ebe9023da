"""A replica's own snapshot, served to a replica that starts: every live row and head it holds
of the regions asked for, in chunks each well under NATS's 1 MB. On a signed catalog each row
and head goes with the proof its owner signed, and the certificates that check them, so the
recipient believes the owners, not this replica."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from souk.catalog.apply import Applier
from souk.catalog.bus import Bus, Message
from souk.catalog.protocol import GLOBAL_REGION
from souk.catalog.signing import b64

SNAPSHOT_CHUNK = 1000  # rows, heads or certificates per chunk


@dataclass(eq=False)
class SnapshotServer:
    bus: Bus
    applier: Applier
    name: str
    secure: bool

    async def on_request(self, msg: Message) -> None:
        a = self.applier
        if not msg.reply or a.bootstrapping:
            return
        try:
            asked = json.loads(msg.data)
        except ValueError:
            return
        if not isinstance(asked, dict):
            return
        wanted = asked.get("regions")
        if a.regions is not None and (wanted is None or not set(wanted) <= a.regions):
            return  # we do not hold everything asked for
        owners = {
            o: st
            for o, st in a.owners.items()
            if wanted is None or st.region in wanted or st.region == GLOBAL_REGION
        }
        a.stream.flush()  # what is read below is what is committed
        secure, store = self.secure, a.store
        proofs = store.head_proofs() if secure else {}
        rows: list[Any] = [
            [
                o,
                {"table": t, "key": k, "seq": seq, "row": orjson.Fragment(text)},
                _fragment(p) if secure else None,
            ]
            for o, t, k, seq, text, p in store.live_rows(set(owners))
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
        certs = [(fp, b64(der)) for fp, der in store.certs().items()] if secure else []
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
        a.stats["snapshots_served"] += 1


def _pieces(items: list[Any]) -> list[list[Any]]:
    return [items[i : i + SNAPSHOT_CHUNK] for i in range(0, len(items), SNAPSHOT_CHUNK)]


def _fragment(text: str | None) -> orjson.Fragment | None:
    return None if text is None else orjson.Fragment(text)

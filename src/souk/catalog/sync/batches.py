"""Live batches: what an owner publishes on its changes subject at each commit, applied at once
when it follows on from the head held, and otherwise applied and the gap pulled."""

from __future__ import annotations

from dataclasses import dataclass

from souk.catalog.bus import Message
from souk.catalog.protocol import decode_batch
from souk.catalog.sync.audit import Audit
from souk.catalog.sync.messages import FromOwners
from souk.catalog.sync.pull import Puller
from souk.catalog.trust import Refused


@dataclass(eq=False)
class Batches(FromOwners):
    audit: Audit
    puller: Puller

    async def on_batch(self, msg: Message) -> None:
        a = self.applier
        batch = self.received(msg, decode_batch, "batch")
        if batch is None or not a.follows(batch.region):
            return
        signed = None
        if self.guard.secure:
            check = self.audit.check(batch, a.owners.get(batch.owner))
            try:
                signed = self.guard.batch(batch, check)
            except Refused as exc:
                self.guard.refuse(exc, f"a batch of {batch.owner!r}")
                if exc.reason == "bad_signature" and self.audit.vouched():
                    self.audit.failed(batch, exc)
                return
        st = a.owner(batch.owner, batch.region, batch.epoch)
        if st is None:
            return
        a.stats["batches"] += 1
        contiguous = batch.prev <= st.head and not a.bootstrapping
        a.take(batch.owner, st, batch.region, batch.head, batch.changes, signed, contiguous)
        if not contiguous:
            a.stats["gaps"] += 1
            self.puller.maybe(batch.owner)

"""Pulls: an owner's rows changed after the head a replica holds, asked of the owner itself when
a batch left a gap or a heartbeat announced a head beyond it. A pull answer is always checked
against the owner's key, on any bus: a replica cannot tell who answered a request.

After a live batch failed its audit, the owner's rows are suspect: they are pulled again from
the start, every version the owner sends replaces the one held (newer or not: a forged row may
carry any sequence), and what the owner no longer has is forgotten."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from souk.catalog.apply import Applier
from souk.catalog.bus import Bus
from souk.catalog.guard import Guard
from souk.catalog.owners import OwnerState
from souk.catalog.protocol import (
    Change,
    ProtocolError,
    PullRequest,
    decode_pull_reply,
    encode,
    pull_subject,
)
from souk.catalog.sync.tasks import Tasks
from souk.catalog.trust import Refused

log = logging.getLogger("souk.catalog.replica")
PULL_TIMEOUT = 2.0


@dataclass(eq=False)
class Puller:
    bus: Bus
    applier: Applier
    guard: Guard
    tasks: Tasks
    timeout: float

    def maybe(self, owner: str) -> None:
        """Pulls from `owner` if it announced more than is applied (and no pull is on)."""
        a = self.applier
        st = a.owners.get(owner)
        if st is None or st.pulling or a.bootstrapping or not a.follows(st.region):
            return
        if st.seen > st.head or st.suspect:
            st.pulling = True
            self.tasks.spawn(self._pull(owner, st))

    def again(self, owner: str) -> None:
        """Everything of `owner`'s pulled again from the start (its rows are suspect)."""
        st = self.applier.owners.get(owner)
        if st is None:
            return
        st.suspect = True
        st.head = st.seen = 0  # a forged head may have run ahead of the owner's
        self.maybe(owner)

    async def _pull(self, owner: str, st: OwnerState) -> None:
        a = self.applier
        again = st.suspect
        if again:
            st.head = 0
        kept: set[tuple[str, str]] = set()  # (table, key) the owner sent, when pulled again
        try:
            while a.owners.get(owner) is st:
                a.stats["pulls"] += 1
                since = st.head
                request = encode(PullRequest(since=since))
                try:
                    data = await self.bus.request(pull_subject(owner), request, self.timeout)
                    reply = decode_pull_reply(data)
                except (TimeoutError, ProtocolError) as exc:
                    a.stats["pull_failures"] += 1
                    log.debug("pull from %s failed: %s", owner, exc)
                    return  # the next heartbeat tries again
                signed = None
                if self.guard.secure:
                    try:
                        signed = self.guard.pull_reply(owner, reply)
                    except Refused as exc:
                        self.guard.refuse(exc, f"a pull reply for {owner!r}")
                        a.stats["pull_failures"] += 1
                        return
                if reply.owner != owner or reply.since > since:
                    a.stats["pull_failures"] += 1  # not an answer to this request
                    return
                current = a.owner(owner, reply.region, reply.epoch)
                if current is None:
                    return
                kept.update((c.table, c.key) for c in reply.changes)
                a.take(owner, current, reply.region, reply.head, reply.changes, signed, True, again)
                if current is not st:
                    return
                if not reply.more:
                    if again:
                        self._forget_all_but(owner, st, kept)
                    return
        finally:
            st.pulling = False

    def _forget_all_but(self, owner: str, st: OwnerState, kept: set[tuple[str, str]]) -> None:
        """After a full pull: the rows of `owner`'s held that the owner did not send were never
        its own, and are forgotten (a deletion at version 0, which anything it writes replaces)."""
        a = self.applier
        gone = [Change(t, k, 0, None) for t, k in a.indexes.keys_of(owner) if (t, k) not in kept]
        if gone:
            a.apply(owner, st.region, gone, replace=True)
        st.suspect = False
        a.stats["repulled"] += 1
        log.info("the rows of %s pulled again after a failed audit: %d forgotten", owner, len(gone))

"""Heartbeats: every owner's sign of life each second, with its epoch, head and apps (the global
index behind `regions_of_app`). A beat that announces a head beyond the one held leads to a pull
if the batches have not closed the distance shortly after."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from souk.catalog.bus import Message
from souk.catalog.owners import OwnerState
from souk.catalog.protocol import decode_heartbeat
from souk.catalog.sync.messages import FromOwners
from souk.catalog.sync.pull import Puller
from souk.catalog.sync.tasks import Tasks
from souk.catalog.trust import Refused

BEAT_GRACE = 0.25  # how long a heartbeat's news may run ahead of its batches before a pull


@dataclass(eq=False)
class Heartbeats(FromOwners):
    puller: Puller
    tasks: Tasks

    async def on_beat(self, msg: Message) -> None:
        a = self.applier
        beat = self.received(msg, decode_heartbeat, "heartbeat")
        if beat is None:
            return
        checked = True
        st = a.owners.get(beat.owner)  # the usual beat's owner, of its epoch: one lookup
        if st is not None and st.epoch != beat.epoch:
            st = None
        if self.guard.trust is not None:
            try:
                checked = self.guard.beat(beat, None if st is None else st.head)
            except Refused as exc:
                self.guard.refuse(exc, f"a heartbeat of {beat.owner!r}")
                return
        if st is None:  # a new owner, or another epoch: `owner` decides
            st = a.owner(beat.owner, beat.region, beat.epoch)
            if st is None:
                return
        a.liveness.heard(beat.owner, st, beat.head if checked else 0)
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
        if beat is not None and beat.head > st.head and self.applier.owners.get(owner) is st:
            try:
                self.guard.beat_signature(beat)
            except Refused as exc:
                self.guard.refuse(exc, f"a heartbeat of {owner!r}")
            else:
                st.seen = max(st.seen, beat.head)
        if self.tasks.running:
            self.puller.maybe(owner)

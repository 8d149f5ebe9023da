"""What an owner publishes on its own subjects, decoded, or dropped and counted."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from souk.catalog.apply import Applier
from souk.catalog.bus import Message
from souk.catalog.guard import Guard
from souk.catalog.protocol import Batch, Heartbeat, ProtocolError, subject_names
from souk.catalog.trust import Refused

log = logging.getLogger("souk.catalog.replica")
Sent = TypeVar("Sent", Batch, Heartbeat)


@dataclass(eq=False)
class FromOwners:
    """What handles the messages an owner publishes on its own subjects (its batches, its
    heartbeats): applied by `applier`, checked by `guard`."""

    applier: Applier
    guard: Guard

    def received(self, msg: Message, decode: Callable[[bytes], Sent], what: str) -> Sent | None:
        """A batch or heartbeat, decoded, if it came on its owner's own subject."""
        try:
            sent = decode(msg.data)
        except ProtocolError as exc:
            self.applier.stats["bad_messages"] += 1
            log.warning("dropped a malformed %s: %s", what, exc)
            return None
        if subject_names(msg.subject) != (sent.region, sent.owner):
            self.guard.refuse(Refused("wrong_subject"), f"a {what} on {msg.subject}")
            return None
        return sent

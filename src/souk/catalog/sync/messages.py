"""What an owner publishes on its own subjects, decoded, or dropped and counted."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from souk.catalog.bus import Message
from souk.catalog.guard import Guard
from souk.catalog.protocol import Batch, Heartbeat, ProtocolError, subject_names
from souk.catalog.trust import Refused

log = logging.getLogger("souk.catalog.replica")
Sent = TypeVar("Sent", Batch, Heartbeat)


def received(
    msg: Message,
    decode: Callable[[bytes], Sent],
    what: str,
    guard: Guard,
    stats: dict[str, int],
) -> Sent | None:
    """A batch or heartbeat, decoded, if it came on its owner's own subject."""
    try:
        sent = decode(msg.data)
    except ProtocolError as exc:
        stats["bad_messages"] += 1
        log.warning("dropped a malformed %s: %s", what, exc)
        return None
    if subject_names(msg.subject) != (sent.region, sent.owner):
        guard.refuse(Refused("wrong_subject"), f"a {what} on {msg.subject}")
        return None
    return sent

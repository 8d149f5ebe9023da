"""What a replica knows of each owner it follows (epoch, head, when last heard), and which owners
have fallen silent."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from souk.catalog.protocol import Heartbeat

UNREACHABLE_AFTER = 3.0


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
    suspect: bool = False  # a live message failed its audit: re-pulled, everything checked


class Liveness:
    """Who has been heard from lately. Every sign of life joins a queue in the order it came,
    and an owner whose last one leaves the window of `unreachable_after` seconds has fallen
    silent: one step per sign of life, so silence costs what the heartbeats already cost, never a
    region's scan. `on_silent` and `on_back` tell the worker index (placement's rows)."""

    def __init__(
        self,
        owners: dict[str, OwnerState],
        unreachable_after: float,
        on_silent: Callable[[str], None],
        on_back: Callable[[str], None],
    ) -> None:
        self.owners = owners
        self.unreachable_after = unreachable_after
        self.on_silent = on_silent
        self.on_back = on_back
        # when (monotonic) and whose; two queues, not one of pairs: a number and a name are no
        # objects for the collector to walk
        self._times: deque[float] = deque()
        self._owners: deque[str] = deque()

    def reachable(self, owner: str) -> bool:
        st = self.owners.get(owner)
        return st is not None and time.monotonic() - st.heard <= self.unreachable_after

    def heard(self, owner: str, st: OwnerState, head: int) -> None:
        """An owner's sign of life: memory only, never a write (a heartbeat that brings no news
        costs a replica no SQLite statement, 1,000 times a second at 1,000 owners)."""
        now = time.monotonic()
        was_silent = st.heard < now - self.unreachable_after
        st.heard = now
        st.heard_wall = time.time()
        if head > st.seen:
            st.seen = head
        if was_silent:
            self.on_back(owner)  # reachable again: back among the placeable rows
        self._times.append(now)
        self._owners.append(owner)
        self.expire(now)

    def expire(self, now: float) -> None:
        """Tells `on_silent` of the owners whose last sign of life is older than
        `unreachable_after`, in the order they were heard."""
        times, since = self._times, now - self.unreachable_after
        while times and times[0] < since:
            heard, owner = times.popleft(), self._owners.popleft()
            st = self.owners.get(owner)
            if st is not None and st.heard == heard:  # else heard from since (queued again)
                self.on_silent(owner)

"""Which workers placement may use, from every sign of life the broker has, not the bus alone.

The catalog replica hears workers on the bus, but the broker reaches them over HTTP: silence on
the bus proves nothing when the broker's own bus link is the one down, or when only the
worker's is. So a worker silent on the bus is *doubtful*, not gone: placement still uses it,
from the broker's last picture, and asks it for offers directly over HTTP, whose answer (or
its failure) is the evidence. A worker is left out only on evidence:

- an HTTP call to it failed at the transport (no answer, refused, timed out): it is skipped for
  `SHUN_FOR` seconds, so that one dead worker costs one create a bounded wait, not every create;
- nothing heard from it by any means (bus heartbeat or HTTP answer) for `STALE` seconds: the
  picture of it is too old to place on.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from souk.catalog.connecting import link_state
from souk.models.catalog import WorkerRow

STALE = 300.0  # a worker not heard from by any means for this long is unreachable
SHUN_FOR = 10.0  # a worker whose HTTP call failed is skipped this long (unless it answers)


class Link(Protocol):
    """The broker's own bus connection, as far as its client knows."""

    @property
    def up(self) -> bool: ...


class BusLink:
    """A bus's link state: a `ConnectingBus` (or a NATS client) knows whether it is connected;
    any other bus (in-process) is always up."""

    def __init__(self, bus: Any) -> None:
        self.bus = bus

    @property
    def up(self) -> bool:
        return link_state(self.bus) == "connected"


class Liveness:
    """What the broker has seen of each worker over HTTP: its last answer and last failure."""

    def __init__(self) -> None:
        self._answered: dict[str, float] = {}  # worker -> unix time of its last answer
        self._failed: dict[str, float] = {}  # worker -> monotonic time of a failure since

    def answered(self, worker: str) -> None:
        self._answered[worker] = time.time()
        self._failed.pop(worker, None)

    def failed(self, worker: str) -> None:
        self._failed[worker] = time.monotonic()

    def shunned(self, worker: str) -> bool:
        at = self._failed.get(worker)
        return at is not None and time.monotonic() - at < SHUN_FOR

    @property
    def any_shunned(self) -> bool:
        """Whether some worker is shunned now; a failure older than `SHUN_FOR` is forgotten
        here, so one failure long ago does not make every later create look for shunned ones."""
        if self._failed:
            since = time.monotonic() - SHUN_FOR
            for worker in [w for w, at in self._failed.items() if at <= since]:
                del self._failed[worker]
        return bool(self._failed)

    def shunned_now(self) -> list[str]:
        """The workers shunned now."""
        return list(self._failed) if self.any_shunned else []

    def heard(self, row: WorkerRow) -> float | None:
        """Unix time the worker was last heard from, by the bus or over HTTP."""
        times = [t for t in (row.last_heartbeat, self._answered.get(row.id)) if t is not None]
        return max(times) if times else None

    def fresh(self, row: WorkerRow, now: float | None = None) -> bool:
        """Heard from by some means within `STALE`."""
        heard = self.heard(row)
        return heard is not None and (now or time.time()) - heard <= STALE

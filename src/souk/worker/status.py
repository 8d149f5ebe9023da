"""What `GET /v1/status` tells an operator: whether the worker can record changes, and whether it
reaches the catalog's bus. Both can be wrong while the HTTP API answers: the worker serves what
it has and says what it waits for."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel

BusState = Literal["none", "connecting", "connected", "disconnected"]  # none: no --nats


class BusLink(Protocol):
    """The worker's link to the catalog's bus, as far as a status needs it."""

    @property
    def state(self) -> BusState: ...

    @property
    def error(self) -> str | None: ...


class StorageStatus(BaseModel):
    writable: bool
    reason: str | None = None  # insufficient_storage, storage_unavailable
    message: str | None = None
    since: float | None = None  # unix time of the first write that failed
    free_bytes: int | None = None
    stalled_operations: int = 0  # accepted, waiting for the data directory to take writes


class BusStatus(BaseModel):
    state: BusState
    connected: bool
    error: str | None = None  # the last reason a connection failed, while it has not come up


class WorkerStatus(BaseModel):
    worker: str
    region: str
    storage: StorageStatus
    bus: BusStatus


def bus_status(link: BusLink | None) -> BusStatus:
    if link is None:
        return BusStatus(state="none", connected=False)
    state = link.state
    return BusStatus(state=state, connected=state == "connected", error=link.error)

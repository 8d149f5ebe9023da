"""Leases, kept by the worker holding the machine, their only writer: any broker passes them
through, so brokers that never talk to each other agree on who holds a machine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from souk.broker.auth import grant_of
from souk.broker.state import Broker
from souk.models.api import CreateLeaseRequest, Lease, WorkerLeaseRequest

if TYPE_CHECKING:
    from souk.broker.api.forward import At


async def take(
    b: Broker, app: str, machine_id: str, ask: WorkerLeaseRequest, nonce: str | None = None
) -> Lease:
    """Take the lease, or refresh it with the nonce of the one held."""
    worker, address = await b.find(app, machine_id)
    return await b.client.acquire_lease(worker, address, machine_id, ask, nonce)


async def take_lease(at: At, body: CreateLeaseRequest) -> Lease:
    """A caller's lease request, taken for its token: the lease's owner is the token's id."""
    ask = WorkerLeaseRequest(
        ttl=body.ttl, description=body.description, owner=grant_of(at.request).token_id
    )
    return await at.client.acquire_lease(*at.on, ask, at.nonce)

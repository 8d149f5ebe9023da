"""Leases, kept by the worker holding the machine, their only writer: any broker passes them
through, so brokers that never talk to each other agree on who holds a machine."""

from __future__ import annotations

from aiohttp import web

from souk.broker.api.params import lease_nonce, machine_ids
from souk.broker.api.state import Broker, broker_of
from souk.broker.auth import grant_of
from souk.models.api import CreateLeaseRequest, Lease, OkResponse, WorkerLeaseRequest
from souk.web import read_model, reply


async def take(
    b: Broker, app: str, machine_id: str, ask: WorkerLeaseRequest, nonce: str | None = None
) -> Lease:
    """Take the lease, or refresh it with the nonce of the one held."""
    worker, address = b.locate(app, machine_id)
    return await b.client.acquire_lease(worker, address, machine_id, ask, nonce)


async def get_lease(request: web.Request) -> web.Response:
    b = broker_of(request)
    app, mid = machine_ids(request)
    await b.machine(app, mid)
    worker, address = b.locate(app, mid)
    return reply(await b.client.lease(worker, address, mid))


async def create_lease(request: web.Request) -> web.Response:
    b = broker_of(request)
    app, mid = machine_ids(request)
    body = await read_model(request, CreateLeaseRequest)
    await b.machine(app, mid)
    ask = WorkerLeaseRequest(
        ttl=body.ttl, description=body.description, owner=grant_of(request).token_id
    )
    return reply(await take(b, app, mid, ask, lease_nonce(request)))


async def release_lease(request: web.Request) -> web.Response:
    b = broker_of(request)
    app, mid = machine_ids(request)
    await b.machine(app, mid)
    worker, address = b.locate(app, mid)
    await b.client.release_lease(worker, address, mid, lease_nonce(request))
    return reply(OkResponse())

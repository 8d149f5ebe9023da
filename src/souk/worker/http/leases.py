"""A machine's lease, kept here, by its only writer."""

from __future__ import annotations

from aiohttp import web

from souk.models.api import NONCE_HEADER, Lease, WorkerLeaseRequest
from souk.web import ApiError, Route, read_model, reply
from souk.worker.http.errors import WRITE_ERRORS
from souk.worker.http.state import BROKERS, M, engine_of, machine_id, nonce


async def get_lease(request: web.Request) -> web.Response:
    lease = engine_of(request).lease(machine_id(request))
    if lease is None:
        raise ApiError(404, "not_found", f"machine {machine_id(request)} has no lease")
    return reply(lease)


async def acquire_lease(request: web.Request) -> web.Response:
    body = await read_model(request, WorkerLeaseRequest)
    lease = await engine_of(request).acquire_lease(
        machine_id(request), body.ttl, body.description, body.owner, nonce(request)
    )
    return reply(lease)


async def release_lease(request: web.Request) -> web.Response:
    await engine_of(request).release_lease(machine_id(request), nonce(request))
    return reply({"ok": True})


ROUTES = [
    Route(
        "GET",
        M + "/lease",
        get_lease,
        "The machine's lease",
        response=Lease,
        errors=(404,),
        roles=BROKERS,
    ),
    Route(
        "POST",
        M + "/lease",
        acquire_lease,
        f"Take a lease, or extend yours (send its nonce in {NONCE_HEADER})",
        WorkerLeaseRequest,
        Lease,
        errors=(404, 409, *WRITE_ERRORS),
        roles=BROKERS,
    ),
    Route(
        "DELETE",
        M + "/lease",
        release_lease,
        f"Release your lease (its nonce in {NONCE_HEADER})",
        errors=(404, 409, *WRITE_ERRORS),
        roles=BROKERS,
    ),
]

"""Why a machine landed where it did: the decision as this broker recorded it when it placed
the machine (`souk.broker.placement.journal`).

Brokers keep no shared state, so only the broker that placed a machine can explain it, and only
for its last creates. Any other answers 404 with reason `not_recorded` when the machine exists
(placed through another broker, before this broker started, or too many creates ago), and with
`not_found` when it does not. A caller behind a load balancer asks again, or asks each broker."""

from __future__ import annotations

from aiohttp import web

from souk.broker.api.params import machine_ids
from souk.broker.state import broker_of
from souk.web import ApiError, reply


async def get_placement(request: web.Request) -> web.Response:
    b = broker_of(request)
    app, mid = machine_ids(request)
    found = b.placer.journal.explanation(app, mid)
    if found is not None:
        return reply(found)
    await b.find(app, mid)  # 404 not_found for a machine that does not exist
    raise ApiError(
        404,
        "not_recorded",
        f"this broker did not record the placement of machine {mid}: it was placed through"
        f" another broker, or more than {b.placer.journal.limit} creates ago",
    )

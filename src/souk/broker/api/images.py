"""An image pinned to the digest its tag names now (souk extension; docs/deploy.md). A deploy
asks once and sends the pinned reference to every machine of its release. The broker reaches no
registry itself: a worker of the region asks, with its own credentials, as it would to run it."""

from __future__ import annotations

import random

from aiohttp import web

from souk.broker.api.errors import passthrough
from souk.broker.state import broker_of
from souk.clients.workers import WorkerCallError
from souk.models.api import IMAGE_FAULTS, PinImageRequest
from souk.web import ApiError, read_model, reply

PIN_TRIES = 3  # workers asked at most, one after the other


async def pin_image(request: web.Request) -> web.Response:
    b = broker_of(request)
    b.require_app(request.match_info["app"])
    body = await read_model(request, PinImageRequest)
    workers = [w for w in b.fleet.workers(region=body.region) if not w.cordoned]
    if not workers:
        where = f"in {body.region}" if body.region else "anywhere"
        raise ApiError(503, "no_workers", f"no reachable worker {where} to ask about the image")
    failed: WorkerCallError | None = None
    for worker in random.sample(workers, min(PIN_TRIES, len(workers))):
        try:
            return reply(await b.client.pin_image(worker.id, worker.address, body.image))
        except WorkerCallError as exc:
            if exc.http_status in IMAGE_FAULTS:
                raise passthrough(exc) from exc
            failed = exc
    assert failed is not None
    raise passthrough(failed) from failed

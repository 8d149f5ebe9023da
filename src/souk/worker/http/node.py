"""The worker as a whole: its capacity and status, offers, image pins, cordoning, metrics."""

from __future__ import annotations

from aiohttp import web

from souk.models.api import PinImageRequest, PinnedImage
from souk.models.capacity import Capacity, Offer, OfferRequest
from souk.pki import mtls_roles
from souk.web import Route, read_model, reply
from souk.web.metrics import METRICS_PATH, serve_metrics
from souk.worker.http.errors import WRITE_ERRORS
from souk.worker.http.state import BROKERS, engine_of
from souk.worker.machines import pinning
from souk.worker.status import WorkerStatus


async def capacity(request: web.Request) -> web.Response:
    return reply(engine_of(request).capacity())


async def status(request: web.Request) -> web.Response:
    return reply(engine_of(request).status())


async def offer(request: web.Request) -> web.Response:
    return reply(engine_of(request).offer(await read_model(request, OfferRequest)))


async def pin_image(request: web.Request) -> web.Response:
    body = await read_model(request, PinImageRequest)
    engine = engine_of(request)
    return reply(await pinning.pin(engine.drivers, engine.settings.name, body.image))


async def cordon(request: web.Request) -> web.Response:
    engine = engine_of(request)
    await engine.set_cordoned(True)
    return reply(engine.capacity())


async def uncordon(request: web.Request) -> web.Response:
    engine = engine_of(request)
    await engine.set_cordoned(False)
    return reply(engine.capacity())


async def metrics(request: web.Request) -> web.Response:
    return await serve_metrics(engine_of(request).metrics.metrics)(request)


ROUTES = [
    Route(
        "GET", "/v1/capacity", capacity, "Totals, reserved, free", response=Capacity, roles=BROKERS
    ),
    Route(
        "GET",
        "/v1/status",
        status,
        "Whether changes can be recorded now, and whether the catalog's bus is reached",
        response=WorkerStatus,
        roles=BROKERS,
    ),
    Route(
        "POST",
        "/v1/offers",
        offer,
        "Would this guest fit here now?",
        OfferRequest,
        Offer,
        roles=BROKERS,
    ),
    Route(
        "POST",
        "/v1/images/pin",
        pin_image,
        "The image with the digest its tag names now, asked of its registry",
        PinImageRequest,
        PinnedImage,
        errors=(400, 404, 409, 502),
        roles=BROKERS,
    ),
    Route(
        "POST",
        "/v1/cordon",
        cordon,
        "Refuse new machines, keep the ones here",
        response=Capacity,
        errors=WRITE_ERRORS,
        roles=BROKERS,  # a broker forwards an operator token's request
    ),
    Route(
        "POST",
        "/v1/uncordon",
        uncordon,
        "Accept new machines again",
        response=Capacity,
        errors=WRITE_ERRORS,
        roles=BROKERS,
    ),
    Route(
        "GET",
        METRICS_PATH,
        metrics,
        "Prometheus metrics (text format)",
        # Prometheus shows an operator certificate; the numbers name no machine, but they tell
        # how busy the host is, which is nobody else's business.
        roles=mtls_roles("operator"),
    ),
]

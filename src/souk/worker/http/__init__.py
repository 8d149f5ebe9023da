"""The worker's internal HTTP API, what brokers and the CLI call: one module per resource, each
with its handlers and its rows of the route table, the roles that may call each route among
them. Handlers reach the engine through the app (`state.ENGINE`)."""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from souk import __version__
from souk.web import Route, add_routes
from souk.worker.engine import Engine
from souk.worker.http import (
    creates,
    inside,
    leases,
    lifecycle,
    machines,
    node,
    observe,
    volumes,
)
from souk.worker.http.errors import HTTP_STATUS, WRITE_ERRORS, answering, http_error
from souk.worker.http.state import BROKERS, ENGINE, FENCES
from souk.worker.machines.admission import Fences

# Each handler's refusals answered through HTTP_STATUS.
ROUTES: list[Route] = [
    replace(route, handler=answering(route.handler))
    for module in (node, creates, machines, lifecycle, leases, inside, observe, volumes)
    for route in module.ROUTES
]


def serve(app: web.Application, engine: Engine) -> None:
    """Serve the worker's routes on `app`, answering for `engine`."""
    app[ENGINE] = engine
    app[FENCES] = Fences()
    add_routes(app, ROUTES, "souk worker", __version__, openapi_roles=BROKERS)


__all__ = ["HTTP_STATUS", "ROUTES", "WRITE_ERRORS", "http_error", "serve"]

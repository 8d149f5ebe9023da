"""Wires a broker together: its fleet view, worker client, placer, auth and HTTP app."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from souk import __version__
from souk.broker.api.errors import worker_errors
from souk.broker.api.routes import ROUTES
from souk.broker.api.state import BROKER, Broker
from souk.broker.auth import make_auth
from souk.web import Route, add_routes, error_middleware

MAX_BODY = 1 << 20


def make_app(broker: Broker, secret: bytes, extra: Sequence[Route] = ()) -> web.Application:
    """The broker's app; `extra` routes (the catalog's, when it runs a replica) share its auth."""
    app = web.Application(
        middlewares=[error_middleware, make_auth(secret), worker_errors], client_max_size=MAX_BODY
    )
    app[BROKER] = broker
    add_routes(app, [*ROUTES, *extra], "souk Machines API", __version__)

    async def close(_: web.Application) -> None:
        await broker.client.close()

    app.on_cleanup.append(close)
    return app

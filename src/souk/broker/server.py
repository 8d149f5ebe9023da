"""Wires a broker together: its fleet view, worker client, placer, auth and HTTP app."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from aiohttp import web

from souk import __version__
from souk.broker.api.errors import fly_statuses, worker_errors
from souk.broker.api.routes import ROUTES
from souk.broker.auth import MachineRegion, make_auth, undeclared
from souk.broker.state import BROKER, IDEMPOTENCY, SEALER, Broker
from souk.broker.ui import pages as ui_pages
from souk.broker.ui.session import ui_session
from souk.sealing import Sealer
from souk.web import ApiError, Route, add_routes, error_middleware
from souk.web.body import MAX_BODY_BYTES


def machine_region(broker: Broker) -> MachineRegion:
    """Where a machine runs, for tokens limited to regions: the catalog's row, else the worker
    the broker just placed it on (the catalog may not show it for a few milliseconds)."""

    def region(app: str, machine_id: str) -> str | None:
        row = broker.fleet.machine(machine_id)
        if row is not None and row.app == app:
            return row.region
        try:
            worker_id, _ = broker.locate(app, machine_id)
        except ApiError:
            return None
        worker = broker.fleet.worker(worker_id)
        return worker.region if worker is not None else None

    return region


def make_app(broker: Broker, secret: bytes, extra: Sequence[Route] = ()) -> web.Application:
    """The broker's app; `extra` routes (the catalog's, when it runs a replica) share its auth.
    Every route must declare its permission: one that does not is a bug, refused here."""
    routes = [*ROUTES, *extra]
    missing = undeclared(routes)
    if missing:
        raise ValueError(f"routes without a permission: {', '.join(missing)}")
    auth = make_auth(secret, broker.fleet.revoked, machine_region(broker))
    app = web.Application(
        middlewares=[
            fly_statuses,
            error_middleware,
            broker.placer.metrics.middleware(),
            ui_session,
            auth,
            worker_errors,
        ],
        client_max_size=MAX_BODY_BYTES,
    )
    app[BROKER] = broker
    app[SEALER] = Sealer(secret)
    app[IDEMPOTENCY] = hmac.new(secret, b"souk idempotency keys", hashlib.sha256).digest()
    add_routes(app, routes, "souk Machines API", __version__)
    ui_pages.install(app)

    async def close(_: web.Application) -> None:
        await broker.placer.reserver.close()
        await broker.placer.client.close()
        await broker.client.close()

    app.on_cleanup.append(close)
    return app

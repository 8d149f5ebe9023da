"""Reservations on the bus: a broker's batch of creates arrives as a `BusReservation` on the
worker's own subject (`reserve_subject`) and is answered by `batch_outcomes`, the code that
answers `POST /v1/machines/batch`, so the two paths admit and create alike.

Who may reserve: over HTTP, a caller whose certificate says broker or operator. NATS core does
not tell a subscriber who published, so a secured worker (`secure`) answers on the bus only when
the bus is the authenticated one (`authenticated`): there nats-server maps every client to the
user of its certificate and lets only brokers publish on `souk.reserve.*`
(`souk.catalog.permissions`), and only this worker subscribe to its subject. A secured worker on
a plain bus does not subscribe: brokers find no responder and reserve over HTTP. A plain worker
(no TLS) answers anyone, as its HTTP API does.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from pydantic import ValidationError

from souk.catalog.bus import Bus, Message, authenticated
from souk.catalog.protocol import reserve_subject
from souk.models.api import BusRefusal, BusReservation
from souk.web import ApiError
from souk.web.errors import error_body
from souk.worker.engine import Engine
from souk.worker.http.creates import batch_outcomes, check_hold
from souk.worker.machines.admission import Fences

log = logging.getLogger("souk.worker")


def refusal(status: int, reason: str, message: str) -> bytes:
    return BusRefusal(status=status, error=error_body(reason, message)).model_dump_json().encode()


@contextlib.asynccontextmanager
async def reserving(
    engine: Engine, fences: Fences, bus: Bus, secure: bool = False
) -> AsyncIterator[bool]:
    """Answer reservations on the worker's subject while open; yields whether it does (a
    secured worker on a bus that cannot vouch for brokers does not)."""
    if secure and not authenticated(bus):
        log.warning("reservations over the bus off: the bus does not enforce who may publish")
        yield False
        return

    async def on_request(msg: Message) -> None:
        if not msg.reply:
            return
        try:
            req = BusReservation.model_validate_json(msg.data)
            seconds = check_hold(req.hold)
        except ValidationError as exc:
            await bus.publish(msg.reply, refusal(400, "invalid", str(exc.errors()[:1])))
            return
        except ApiError as exc:
            await bus.publish(msg.reply, refusal(exc.http_status, exc.reason, exc.message))
            return
        outcomes = await batch_outcomes(fences, engine, req.batch, seconds)
        await bus.publish(msg.reply, outcomes.model_dump_json().encode())

    sub = await bus.subscribe(reserve_subject(engine.settings.name), on_request)
    try:
        yield True
    finally:
        await sub.unsubscribe()

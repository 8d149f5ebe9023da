"""Creating machines: one, or several recorded together, each held provisionally (with
`HOLD_HEADER`) until its broker confirms it sent the answer on."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from souk.models.api import (
    HOLD_HEADER,
    ConfirmationResult,
    Confirmations,
    CreateBatch,
    CreateOutcome,
    CreateOutcomes,
)
from souk.models.machine import CreateMachine, Machine
from souk.web import ApiError, Route, read_model, reply
from souk.web.errors import error_body
from souk.worker.engine import Engine
from souk.worker.errors import AlreadyExists, WorkerError
from souk.worker.http.errors import WRITE_ERRORS, http_error
from souk.worker.http.state import BROKERS, FENCES, engine_of
from souk.worker.machines.admission import Fences
from souk.worker.machines.holds import MAX_HOLD

log = logging.getLogger("souk.worker")

# How long a create with `start: true` may wait to answer with its machine started (or failed):
# well within the share of its deadline a broker gives one worker.
CREATE_WAIT = 0.5


def _fenced(machine_id: str) -> AlreadyExists:
    return AlreadyExists(
        f"machine {machine_id} was destroyed by a broker that lost its create's answer:"
        " this create came too late"
    )


def _hold(request: web.Request) -> float | None:
    return check_hold(request.headers.get(HOLD_HEADER))


def check_hold(raw: str | float | None) -> float | None:
    """A create's hold, in seconds, as the HTTP header or a bus reservation gives it."""
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_HOLD:
        raise ApiError(400, "invalid", f"{HOLD_HEADER}: seconds, above 0, at most {MAX_HOLD:g}")
    return seconds


async def _create_one(
    fences: Fences, engine: Engine, body: CreateMachine, seconds: float | None
) -> Machine:
    if fences.holds(body.id):
        raise _fenced(body.id or "")
    machine = await engine.create(body, seconds, wait=CREATE_WAIT)
    if fences.holds(machine.id):  # fenced while it was being recorded
        await engine.submit(machine.id, "destroy", {"force": True})
        raise _fenced(machine.id)
    return machine


async def create(request: web.Request) -> web.Response:
    body = await read_model(request, CreateMachine)
    machine = await _create_one(request.app[FENCES], engine_of(request), body, _hold(request))
    return reply(machine, status=201)


async def create_batch(request: web.Request) -> web.Response:
    body = await read_model(request, CreateBatch)
    seconds = _hold(request)
    return reply(await batch_outcomes(request.app[FENCES], engine_of(request), body, seconds))


async def batch_outcomes(
    fences: Fences, engine: Engine, body: CreateBatch, seconds: float | None
) -> CreateOutcomes:
    """A batch's creates, each answered as it would be alone, and its confirmations: what `POST
    /v1/machines/batch` answers, and a reservation on the bus too (`souk.worker.reserving`)."""

    async def outcome(create: CreateMachine) -> CreateOutcome:
        try:
            machine = await _create_one(fences, engine, create, seconds)
            return CreateOutcome(status=201, machine=machine)
        except WorkerError as exc:
            err = http_error(exc)
        except Exception:  # one create's fault is its own 500, as it would be alone
            log.exception("create %s of a batch failed", create.id)
            err = ApiError(500, "internal_error", "internal error; see the server's log")
        error = error_body(err.reason, err.message, err.details)
        return CreateOutcome(status=err.http_status, error=error)

    async def confirmed() -> dict[str, str]:
        if not body.confirm:
            return {}
        try:
            return await engine.confirm(body.confirm)
        except Exception:  # the ids are missing from the answer: sent again
            log.exception("confirmations riding with a batch failed")
            return {}

    # at once, so that the store commits them together
    *outcomes, holds = await asyncio.gather(*map(outcome, body.machines), confirmed())
    return CreateOutcomes.model_validate({"outcomes": outcomes, "holds": holds})


async def confirm(request: web.Request) -> web.Response:
    body = await read_model(request, Confirmations)
    holds = await engine_of(request).confirm(body.ids)
    return reply(ConfirmationResult.model_validate({"holds": holds}))


ROUTES = [
    Route(
        "POST",
        "/v1/machines",
        create,
        "Reserve and create a machine; with `start`, answered once it runs (or within"
        f" {CREATE_WAIT:g}s)",
        CreateMachine,
        Machine,
        201,
        errors=(409, 412, *WRITE_ERRORS),
        roles=BROKERS,
    ),
    Route(
        "POST",
        "/v1/machines/batch",
        create_batch,
        "Several creates at once, each reserved and answered (in `outcomes`, in order) as"
        " it would be alone, and the holds in `confirm` ended (in `holds`); recorded"
        " together",
        CreateBatch,
        CreateOutcomes,
        roles=BROKERS,
    ),
    Route(
        "POST",
        "/v1/confirmations",
        confirm,
        f"End the provisional holds of machines created with {HOLD_HEADER}",
        Confirmations,
        ConfirmationResult,
        errors=WRITE_ERRORS,
        roles=BROKERS,
    ),
]

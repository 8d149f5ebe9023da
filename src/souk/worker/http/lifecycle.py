"""The machine's lifecycle verbs, each one row: an operation of the machine's state machine
(`souk.worker.ops.fsm`) submitted to its log, answered with the machine."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel

from souk.models.machine import Machine, StopRequest
from souk.web import Route, read_model, reply
from souk.web.routes import Handler
from souk.worker.http.errors import WRITE_ERRORS
from souk.worker.http.state import BROKERS, M, engine_of, machine_id, nonce


def verb(op: str, summary: str, body: type[BaseModel] | None = None) -> Route:
    """POST /v1/machines/{id}/<op>: submit `op`, its parameters the body's fields if it takes
    one."""

    async def submit(request: web.Request) -> web.Response:
        params = None
        if body is not None:
            params = (await read_model(request, body)).model_dump(exclude_none=True)
        machine = await engine_of(request).submit(machine_id(request), op, params, nonce(request))
        return reply(machine)

    handler: Handler = submit
    return Route(
        "POST",
        f"{M}/{op}",
        handler,
        summary,
        body,
        Machine,
        errors=(404, 409, *WRITE_ERRORS),
        roles=BROKERS,
    )


ROUTES = [
    verb("start", "Start"),
    verb("stop", "Stop: signal, then SIGKILL after the timeout", StopRequest),
    verb("restart", "Restart"),
    verb(
        "suspend",
        "Suspend: freeze its processes in memory, keep its reservation; start resumes it",
    ),
]

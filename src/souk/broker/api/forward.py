"""Routes that only pass a request on to the worker holding its machine or volume, the thing's
only writer: each is one row of the route table, `forward(where, call, answer)`: find the
worker (`where`), make one client call, shape the answer. A new machine verb is one such row
here (`verb`), as it is one row of the worker's table."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel

from souk.broker.api.answers import fly_reply, public
from souk.broker.api.params import lease_nonce, machine_ids
from souk.broker.api.volumes import locate
from souk.broker.state import broker_of
from souk.clients.workers import WorkerClient
from souk.models.api import OkResponse
from souk.models.machine import Machine
from souk.web import read_model, reply
from souk.web.routes import Handler

T = TypeVar("T")
B = TypeVar("B", bound=BaseModel)


@dataclass(frozen=True)
class At:
    """Where a request's machine or volume is: the client to its worker, and `on`, the
    (worker, address, id) every call of that client begins with."""

    request: web.Request
    client: WorkerClient
    on: tuple[str, str, str]

    @property
    def nonce(self) -> str | None:
        """The nonce of the lease the caller holds, if it sent one."""
        return lease_nonce(self.request)


Where = Callable[[web.Request], Awaitable[At]]


async def machine(request: web.Request) -> At:
    """The worker holding the app's machine (404 if the app has none of that id)."""
    b = broker_of(request)
    app, mid = machine_ids(request)
    worker, address = await b.find(app, mid)
    return At(request, b.client, (worker, address, mid))


async def shown_machine(request: web.Request) -> At:
    """As `machine`, once its worker has shown the machine is the app's (a round trip more)."""
    await broker_of(request).machine(*machine_ids(request))
    return await machine(request)


async def volume(request: web.Request) -> At:
    """The worker holding the app's volume, asked (404 if none has it, 503 if its worker does
    not answer)."""
    b = broker_of(request)
    vid = request.match_info["id"]
    worker, _ = await locate(b, request.match_info["app"], vid)
    return At(request, b.client, (worker.id, worker.address, vid))


def forward(
    where: Where, call: Callable[[At], Awaitable[T]], answer: Callable[[T], web.Response]
) -> Handler:
    """A handler: `call` on the worker `where` finds, its result shaped by `answer`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return answer(await call(await where(request)))

    return handler


def forward_body(
    where: Where,
    body: type[B],
    call: Callable[[At, B], Awaitable[T]],
    answer: Callable[[T], web.Response],
) -> Handler:
    """As `forward`, for a route with a body: read (a 400 if bad) before the worker is found."""

    async def handler(request: web.Request) -> web.StreamResponse:
        sent = await read_model(request, body)
        return answer(await call(await where(request), sent))

    return handler


def verb(op: str, body: type[BaseModel] | None = None) -> Handler:
    """POST .../machines/{id}/<op> (a lifecycle verb), passed on to the machine's worker with
    the caller's lease nonce, answered with the machine as Fly shows it."""
    if body is None:
        return forward(machine, lambda at: at.client.verb(*at.on, op, at.nonce), as_machine)
    return forward_body(
        machine, body, lambda at, sent: at.client.verb(*at.on, op, at.nonce, sent), as_machine
    )


# --- answers -------------------------------------------------------------------------------


def as_machine(machine: Machine) -> web.Response:
    return fly_reply(public(machine))


def as_ok(_: object) -> web.Response:
    return reply(OkResponse())

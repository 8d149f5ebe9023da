"""Acting on one machine without changing its config, each on the machine's worker: suspend
(a start resumes), signal, exec, ps, and the list of its config versions."""

from __future__ import annotations

from aiohttp import web

from souk.broker.api.answers import fly_reply
from souk.broker.api.machines import public
from souk.broker.api.params import lease_nonce, machine_ids
from souk.broker.api.state import Broker, broker_of
from souk.models.api import OkResponse
from souk.models.machine_ops import ExecRequest, SignalRequest
from souk.web import read_model, reply


async def _located(request: web.Request) -> tuple[Broker, str, str, str]:
    """The broker, and the machine's worker, its address and its id (404 if not in the app)."""
    b = broker_of(request)
    app, mid = machine_ids(request)
    worker, address = await b.find(app, mid)
    return b, worker, address, mid


async def suspend_machine(request: web.Request) -> web.Response:
    b, worker, address, mid = await _located(request)
    return fly_reply(public(await b.client.suspend(worker, address, mid, lease_nonce(request))))


async def signal_machine(request: web.Request) -> web.Response:
    body = await read_model(request, SignalRequest)
    b, worker, address, mid = await _located(request)
    await b.client.signal(worker, address, mid, body, lease_nonce(request))
    return reply(OkResponse())


async def exec_machine(request: web.Request) -> web.Response:
    body = await read_model(request, ExecRequest)
    b, worker, address, mid = await _located(request)
    result = await b.client.exec(worker, address, mid, body)
    return reply(result.model_dump(exclude_none=True))  # exit_signal only when a signal ended it


async def machine_processes(request: web.Request) -> web.Response:
    b, worker, address, mid = await _located(request)
    params = {k: v for k, v in request.query.items() if k in ("sort_by", "order")}
    return fly_reply(await b.client.processes(worker, address, mid, params), keep_empty=True)


async def machine_versions(request: web.Request) -> web.Response:
    b, worker, address, mid = await _located(request)
    return fly_reply(await b.client.versions(worker, address, mid))

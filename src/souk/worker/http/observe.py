"""Watching a machine: waiting for a state, its log of operations, its output."""

from __future__ import annotations

from typing import cast, get_args

from aiohttp import web

from souk.models.machine import MachineEvent, MachineState, WaitResult
from souk.web import ApiError, Number, Route, number, reply
from souk.web.errors import error_body
from souk.worker.host import logs
from souk.worker.http.state import BROKERS, M, engine_of, flag, machine_id

MAX_WAIT = 60.0


async def wait(request: web.Request) -> web.Response:
    state = request.query.get("state", "started")
    if state not in get_args(MachineState):
        raise ApiError(400, "invalid", f"state: unknown state {state!r}")
    timeout = number(request, "timeout", 10.0)
    ok, machine = await engine_of(request).wait(
        machine_id(request),
        cast(MachineState, state),
        timeout,
        request.query.get("instance_id"),
    )
    result = WaitResult(ok=ok, state=machine.state, instance_id=machine.instance_id)
    if ok:
        return reply(result)
    # an error like any other (as documented), that still says where the machine is
    message = f"machine {machine.id} did not reach {state} within {timeout:g}s"
    body = error_body("timeout", message).model_dump(exclude_none=True)
    return reply({**body, **result.model_dump(mode="json")}, status=408)


async def events(request: web.Request) -> web.Response:
    engine = engine_of(request)
    engine.get(machine_id(request), events=False)
    return reply(engine.events(machine_id(request)))


async def get_logs(request: web.Request) -> web.StreamResponse:
    engine, mid = engine_of(request), machine_id(request)
    engine.get(mid, events=False)
    stream = request.query.get("stream", "stdout")
    if stream not in logs.STREAMS:
        raise ApiError(400, "invalid", "stream: stdout or stderr")
    rundir = engine.settings.rundir(mid)
    tail = logs.read_tail(rundir, stream, engine.settings.log_max_bytes)
    if not flag(request, "follow"):
        return web.Response(body=tail, content_type="text/plain")
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    await response.write(tail)
    async for chunk in logs.follow(rundir, stream):
        await response.write(chunk)
    return response


ROUTES = [
    Route(
        "GET",
        M + "/wait",
        wait,
        "Long-poll until the machine reaches a state",
        response=WaitResult,
        errors=(404, 408),
        query={
            "state": "default started",
            "timeout": Number("seconds, default 10", 0, MAX_WAIT, whole=False),
            "instance_id": "only this instance",
        },
        roles=BROKERS,
    ),
    Route(
        "GET",
        M + "/events",
        events,
        "The machine's log of operations",
        response=list[MachineEvent],
        errors=(404,),
        roles=BROKERS,
    ),
    Route(
        "GET",
        M + "/logs",
        get_logs,
        "stdout or stderr; follow=true streams",
        query={"stream": "stdout or stderr", "follow": "keep streaming"},
        errors=(404,),
        roles=BROKERS,
    ),
]

"""A worker's machines as records: listed, read, updated in place, destroyed, and their past
configs."""

from __future__ import annotations

from aiohttp import web

from souk.models.machine import Machine, MetadataChange, UpdateMachine
from souk.models.machine_ops import MachineVersion
from souk.web import Route, read_model, reply
from souk.worker.http.errors import WRITE_ERRORS
from souk.worker.http.state import BROKERS, FENCES, M, engine_of, flag, machine_id, nonce


async def list_machines(request: web.Request) -> web.Response:
    include = flag(request, "include_deleted")
    return reply(engine_of(request).machines(request.query.get("app"), include_destroyed=include))


async def get(request: web.Request) -> web.Response:
    return reply(engine_of(request).get(machine_id(request)))


async def update(request: web.Request) -> web.Response:
    body = await read_model(request, UpdateMachine)
    engine, mid = engine_of(request), machine_id(request)
    return reply(await engine.update(mid, body.config, body.start, nonce(request), body.secrets))


async def patch_metadata(request: web.Request) -> web.Response:
    body = await read_model(request, MetadataChange)
    machine = await engine_of(request).patch_metadata(machine_id(request), body, nonce(request))
    return reply(machine)


async def versions(request: web.Request) -> web.Response:
    return reply(engine_of(request).versions(machine_id(request)))


async def destroy(request: web.Request) -> web.Response:
    mid = machine_id(request)
    if flag(request, "fence"):
        request.app[FENCES].fence(mid)
    params = {"force": flag(request, "force")}
    return reply(await engine_of(request).submit(mid, "destroy", params, nonce(request)))


ROUTES = [
    Route(
        "GET",
        "/v1/machines",
        list_machines,
        "List machines",
        response=list[Machine],
        query={"app": "only this app's", "include_deleted": "also destroyed ones"},
        roles=BROKERS,
    ),
    Route(
        "GET",
        M,
        get,
        "A machine and its recent events",
        response=Machine,
        errors=(404,),
        roles=BROKERS,
    ),
    Route(
        "PUT",
        M,
        update,
        "Update in place: new config, new instance id",
        UpdateMachine,
        Machine,
        errors=(404, 409, 412, *WRITE_ERRORS),
        roles=BROKERS,
    ),
    Route(
        "PATCH",
        M + "/metadata",
        patch_metadata,
        "Set and delete metadata keys in place: no restart, same instance",
        MetadataChange,
        Machine,
        errors=(404, 409, 413, *WRITE_ERRORS),
        roles=BROKERS,
    ),
    Route(
        "GET",
        M + "/versions",
        versions,
        "Every config the machine has had, newest first",
        response=list[MachineVersion],
        errors=(404,),
        roles=BROKERS,
    ),
    Route(
        "DELETE",
        M,
        destroy,
        "Destroy and release its reservation",
        response=Machine,
        query={"force": "kill it even if it is running"},
        errors=(404, 409, *WRITE_ERRORS),
        roles=BROKERS,
    ),
]

"""A machine's metadata, changed in place on its worker (same instance, no restart, checked
against the lease there), and the cordon that takes a machine out of the proxy's rotation."""

from __future__ import annotations

from aiohttp import web

from souk.broker.api.params import lease_nonce, machine_ids
from souk.broker.state import broker_of
from souk.models.api import MetadataPatch, MetadataValue, OkResponse
from souk.models.machine import Machine, MetadataChange
from souk.models.wire import CORDON_KEY
from souk.web import ApiError, read_model, reply


async def set_metadata(
    request: web.Request, changes: dict[str, str | None], version: str | None = None
) -> Machine:
    """Set each key with a value, delete each without; refused with a 412 when `version` is not
    the machine's instance id."""
    b = broker_of(request)
    app, mid = machine_ids(request)
    if version is not None:
        current = await b.machine(app, mid)
        if version != current.instance_id:
            raise ApiError(
                412, "precondition_failed", f"machine_version: machine is at {current.instance_id}"
            )
    patch = MetadataChange(
        set={k: v for k, v in changes.items() if v},
        delete=[k for k, v in changes.items() if not v],
    )
    worker, address = await b.find(app, mid)
    return await b.client.patch_metadata(worker, address, mid, patch, lease_nonce(request))


async def get_metadata(request: web.Request) -> web.Response:
    machine = await broker_of(request).machine(*machine_ids(request))
    return reply(machine.config.metadata)


async def patch_metadata(request: web.Request) -> web.Response:
    body = await read_model(request, MetadataPatch)
    await set_metadata(request, body.metadata, body.machine_version)
    return web.Response(status=204)


async def put_metadata_key(request: web.Request) -> web.Response:
    body = await read_model(request, MetadataValue)
    await set_metadata(request, {request.match_info["key"]: body.value})
    return web.Response(status=204)


async def delete_metadata_key(request: web.Request) -> web.Response:
    await set_metadata(request, {request.match_info["key"]: None})
    return web.Response(status=204)


async def cordon_machine(request: web.Request) -> web.Response:
    await set_metadata(request, {CORDON_KEY: "true"})
    return reply(OkResponse())


async def uncordon_machine(request: web.Request) -> web.Response:
    await set_metadata(request, {CORDON_KEY: None})
    return reply(OkResponse())

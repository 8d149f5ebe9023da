"""A worker's volumes: reserved disk, grown online, snapshotted; the path's `{id}` is the
volume's."""

from __future__ import annotations

from aiohttp import web

from souk.models.volume import (
    CreateVolume,
    ExtendVolumeRequest,
    ExtendVolumeResponse,
    UpdateVolumeRequest,
    Volume,
    VolumeSnapshot,
)
from souk.web import ApiError, Route, read_model, reply
from souk.worker.http.errors import WRITE_ERRORS
from souk.worker.http.state import BROKERS, V, engine_of, machine_id


async def create_volume(request: web.Request) -> web.Response:
    body = await read_model(request, CreateVolume)
    return reply(await engine_of(request).create_volume(body), status=201)


async def list_volumes(request: web.Request) -> web.Response:
    return reply(engine_of(request).list_volumes(request.query.get("app")))


async def get_volume(request: web.Request) -> web.Response:
    return reply(engine_of(request).volume(machine_id(request)))


async def update_volume(request: web.Request) -> web.Response:
    body = await read_model(request, UpdateVolumeRequest)
    return reply(await engine_of(request).update_volume(machine_id(request), body))


async def destroy_volume(request: web.Request) -> web.Response:
    return reply(await engine_of(request).destroy_volume(machine_id(request)))


async def extend_volume(request: web.Request) -> web.Response:
    body = await read_model(request, ExtendVolumeRequest)
    volume = await engine_of(request).extend_volume(machine_id(request), body.wanted_mb())
    return reply(ExtendVolumeResponse(volume=volume, needs_restart=False))


async def list_snapshots(request: web.Request) -> web.Response:
    return reply(engine_of(request).snapshots(machine_id(request)))


async def create_snapshot(request: web.Request) -> web.Response:
    engine = engine_of(request)
    snapshot_id = await engine.snapshot_volume(machine_id(request))
    made = [s for s in engine.snapshots(machine_id(request)) if s.id == snapshot_id]
    if not made:
        raise ApiError(500, "snapshot_failed", f"snapshot {snapshot_id} was not made")
    return reply(made[0], status=201)


ROUTES = [
    Route(
        "POST",
        "/v1/volumes",
        create_volume,
        "Reserve disk and make a volume (or restore a snapshot into a new one)",
        CreateVolume,
        Volume,
        201,
        errors=(409, 412, *WRITE_ERRORS),
        roles=BROKERS,
    ),
    Route(
        "GET",
        "/v1/volumes",
        list_volumes,
        "List volumes",
        response=list[Volume],
        query={"app": "only this app's"},
        roles=BROKERS,
    ),
    Route("GET", V, get_volume, "A volume", response=Volume, errors=(404,), roles=BROKERS),
    Route(
        "PUT",
        V,
        update_volume,
        "Change a volume's snapshot retention",
        UpdateVolumeRequest,
        Volume,
        errors=(404, *WRITE_ERRORS),
        roles=BROKERS,
    ),
    Route(
        "DELETE",
        V,
        destroy_volume,
        "Destroy a volume and its snapshots; refused while a machine mounts it",
        response=Volume,
        errors=(404, 409, *WRITE_ERRORS),
        roles=BROKERS,
    ),
    Route(
        "PUT",
        V + "/extend",
        extend_volume,
        "Grow a volume, online",
        ExtendVolumeRequest,
        ExtendVolumeResponse,
        errors=(404, 409, 412, *WRITE_ERRORS),
        roles=BROKERS,
    ),
    Route(
        "GET",
        V + "/snapshots",
        list_snapshots,
        "A volume's snapshots, oldest first",
        response=list[VolumeSnapshot],
        errors=(404,),
        roles=BROKERS,
    ),
    Route(
        "POST",
        V + "/snapshots",
        create_snapshot,
        "Take a consistent snapshot (the file system is frozen while it is copied)",
        response=VolumeSnapshot,
        status=201,
        errors=(404, 409, *WRITE_ERRORS),
        roles=BROKERS,
    ),
]

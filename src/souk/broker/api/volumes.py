"""Volumes: placed by disk free (and kept apart from the app's others), then driven on the worker
that holds each one, its only writer.

A volume's id ends with its worker's tag, as a machine's does, so any broker finds the worker
from the id alone, even before the catalog shows the volume: a machine that mounts it is then
placed on that worker or nowhere (`pin_to_volume`).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from aiohttp import web

from souk.broker.api.answers import fly_reply
from souk.broker.placement.reservation import worker_tag
from souk.broker.state import FIND_TIMEOUT, Broker, broker_of
from souk.clients.workers import WorkerCallError
from souk.models.catalog import WorkerRow
from souk.models.fit import disk_misfit
from souk.models.machine_config import MachineConfig
from souk.models.volume import (
    CreateVolume,
    CreateVolumeRequest,
    Volume,
)
from souk.web import ApiError, read_model


def new_volume_id(worker: str) -> str:
    return f"vol_{secrets.token_hex(5)}{worker_tag(worker)}"


def volume_of_snapshot(snapshot_id: str) -> str | None:
    """Snapshot ids name their volume: `vs_<volume id without vol_>_<n>`."""
    parts = snapshot_id.split("_")
    return f"vol_{parts[1]}" if len(parts) == 3 and parts[0] == "vs" else None


async def locate(b: Broker, app: str, volume_id: str) -> tuple[WorkerRow, Volume]:
    """The worker holding the app's volume, and the volume as it has it; 404 otherwise."""
    candidates = b.tagged(volume_id)
    found = await asyncio.gather(
        *(b.client.volume(w.id, w.address, volume_id, FIND_TIMEOUT) for w in candidates),
        return_exceptions=True,
    )
    for worker, volume in zip(candidates, found, strict=True):
        if isinstance(volume, Volume) and volume.app == app:
            return worker, volume
    unreachable = [w.id for w, v in zip(candidates, found, strict=True) if _unreachable(v)]
    if unreachable:
        raise ApiError(
            503,
            "worker_unreachable",
            f"volume {volume_id}: its worker does not answer",
            {"workers": unreachable},
        )
    raise ApiError(404, "not_found", f"volume {volume_id} not found in app {app}")


def _unreachable(result: object) -> bool:
    return isinstance(result, WorkerCallError) and result.http_status == 0


async def app_volumes(b: Broker, app: str) -> list[Volume]:
    """Every volume of the app, from the workers that hold them (the catalog's rows say which;
    without a catalog, every worker is asked), as each has it now."""
    workers = b.fleet.workers(reachable_only=False)
    holders = b.fleet.volume_holders(app)
    if holders is not None:
        workers = [w for w in workers if w.id in holders]
    results = await asyncio.gather(
        *(b.client.volumes(w.id, w.address, app, FIND_TIMEOUT) for w in workers),
        return_exceptions=True,
    )
    out = [v for result in results if isinstance(result, list) for v in result]
    out.sort(key=lambda v: (v.created_at, v.id))
    return out


async def pin_to_volume(
    b: Broker, app: str, region: str | None, config: MachineConfig
) -> tuple[frozenset[str], str | None]:
    """For a machine that mounts a volume: every other worker of the region, to be avoided, so
    placement tries the volume's worker and no other, and the region (the volume's, for a
    create that names none); 412 with the reason if it cannot."""
    if not config.mounts:
        return frozenset(), region
    volume_id = config.mounts[0].volume
    try:
        worker, volume = await locate(b, app, volume_id)
    except ApiError as exc:
        raise ApiError(
            412,
            "volume_unavailable",
            f"mounts: volume {volume_id}: {exc.message}",
            {"volume": volume_id},
        ) from None
    region = region or worker.region
    if worker.region != region:
        raise ApiError(
            412,
            "volume_unavailable",
            f"mounts: volume {volume_id} is in region {worker.region}, not {region}",
            {"volume": volume_id, "worker": worker.id, "region": worker.region},
        )
    if volume.attached_machine_id:
        raise ApiError(
            409,
            "volume_attached",
            f"mounts: volume {volume_id} is mounted by machine {volume.attached_machine_id}",
            {"volume": volume_id, "machine": volume.attached_machine_id},
        )
    others = b.fleet.workers(region=region, reachable_only=False)
    return frozenset(w.id for w in others if w.id != worker.id), region


def _region(b: Broker, asked: str | None) -> str:
    if asked:
        return asked
    regions = sorted({w.region for w in b.fleet.workers()})
    if len(regions) == 1:
        return regions[0]
    raise ApiError(400, "invalid", f"region: required (this cluster has {', '.join(regions)})")


async def list_volumes(request: web.Request) -> web.Response:
    b = broker_of(request)
    app = request.match_info["app"]
    b.require_app(app)
    return fly_reply(await app_volumes(b, app))


async def create_volume(request: web.Request) -> web.Response:
    b = broker_of(request)
    app = request.match_info["app"]
    body = await read_model(request, CreateVolumeRequest)
    b.require_app(app)
    size_mb = body.wanted_mb()
    if body.snapshot_id is not None:  # a snapshot is restored on the worker that holds it
        source = volume_of_snapshot(body.snapshot_id)
        if source is None:
            raise ApiError(400, "invalid", "snapshot_id: not a snapshot id")
        worker, _ = await locate(b, app, source)
        candidates = [worker]
    else:
        region = _region(b, body.region)
        candidates = await _candidates(b, app, region, body, size_mb or 0)
    refusals: list[dict[str, Any]] = []
    for worker in candidates:
        req = CreateVolume(
            app=app,
            id=new_volume_id(worker.id),
            name=body.name,
            size_mb=size_mb,
            snapshot_id=body.snapshot_id,
            snapshot_retention=body.snapshot_retention,
        )
        try:
            volume = await b.client.create_volume(worker.id, worker.address, req)
        except WorkerCallError as exc:
            if exc.http_status not in (0, 412, 409, 503, 507) or body.snapshot_id is not None:
                raise
            refusals.append({"worker": worker.id, "reason": exc.message})
            continue
        return fly_reply(volume)
    raise ApiError(
        412,
        "insufficient_capacity",
        f"no worker could make a {size_mb} MB volume",
        {"refusals": refusals},
    )


async def _candidates(
    b: Broker, app: str, region: str, body: CreateVolumeRequest, size_mb: int
) -> list[WorkerRow]:
    """The region's workers that may take the volume, most disk free first: the fit rule on
    the catalog's rows, then `require_unique_zone` (not a worker that already holds a volume of
    the app of that name; of any name with `unique_zone_app_wide`)."""
    rows = b.fleet.workers(region=region)
    if not rows:
        raise ApiError(400, "invalid", f"region: no region {region!r} in this cluster")
    refusals: list[dict[str, str]] = []
    fit: list[WorkerRow] = []
    for w in rows:
        found = disk_misfit(
            size_mb,
            disk_mb_free=w.disk_mb_free,
            volumes_refused=w.volumes_refused,
            cordoned=w.cordoned,
            draining=w.draining,
        )
        if found is None:
            fit.append(w)
        else:
            refusals.append({"worker": w.id, "reason": found.reason})
    if body.require_unique_zone:
        taken = {
            v.zone
            for v in await app_volumes(b, app)
            if body.unique_zone_app_wide or v.name == body.name
        }
        for w in [w for w in fit if w.id in taken]:
            refusals.append({"worker": w.id, "reason": "holds another of the app's volumes"})
        fit = [w for w in fit if w.id not in taken]
    if not fit:
        raise ApiError(
            412,
            "insufficient_capacity",
            f"no worker in {region} can take a {size_mb} MB volume"
            + (" on its own (require_unique_zone)" if body.require_unique_zone else ""),
            {"region": region, "refusals": refusals},
        )
    fit.sort(key=lambda w: (-w.disk_mb_free, w.id))
    return fit


async def get_volume(request: web.Request) -> web.Response:
    b = broker_of(request)
    _, volume = await locate(b, request.match_info["app"], request.match_info["id"])
    return fly_reply(volume)

"""The fleet, for operators: the workers as the catalog shows them, and their cordons."""

from __future__ import annotations

from aiohttp import web

from souk.broker.state import broker_of
from souk.models.api import WorkerInfo
from souk.web import ApiError, reply


async def list_workers(request: web.Request) -> web.Response:
    fleet = broker_of(request).fleet
    region = request.query.get("region") or None
    reachable = {w.id for w in fleet.workers(region=region, reachable_only=True)}
    rows = sorted(
        fleet.workers(region=region, reachable_only=False), key=lambda w: (w.region, w.id)
    )
    return reply(
        [
            WorkerInfo(
                id=w.id,
                region=w.region,
                address=w.address,
                cpus_total=w.cpus_total,
                cpus_free=w.cpus_free,
                memory_mb_total=w.memory_mb_total,
                memory_mb_free=w.memory_mb_free,
                machines=w.machines,
                cordoned=w.cordoned,
                reachable=w.id in reachable,
            )
            for w in rows
        ]
    )


async def cordon_worker(request: web.Request) -> web.Response:
    """Cordon or uncordon, by the path: the worker keeps its own cordon, as it judges its own
    capacity."""
    b = broker_of(request)
    wid = request.match_info["worker"]
    worker = b.fleet.worker(wid)
    if worker is None:
        raise ApiError(404, "not_found", f"worker {wid} not found")
    cordoned = request.path.endswith("/cordon")
    return reply(await b.client.cordon(wid, worker.address, cordoned))

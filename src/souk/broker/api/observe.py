"""What Prometheus reads from a broker: its own metrics, and where the machines' own metrics
are (Fly's `config.metrics`), as targets for Prometheus' HTTP service discovery."""

from __future__ import annotations

from aiohttp import web

from souk.broker.state import broker_of
from souk.models.catalog import MachineRow
from souk.web import audience_of, reply
from souk.web.metrics import CONTENT_TYPE


async def metrics(request: web.Request) -> web.Response:
    body = broker_of(request).placer.metrics.metrics.render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE
    return response


def target(row: MachineRow) -> dict[str, object] | None:
    """One machine's scrape target, or None: only a started machine with an address and
    `config.metrics` has one. Its labels name the machine; Prometheus keeps them per series."""
    found = row.metrics
    if found is None or found.port is None or row.state != "started" or not row.private_ip:
        return None
    host = f"[{row.private_ip}]" if ":" in row.private_ip else row.private_ip
    return {
        "targets": [f"{host}:{found.port}"],
        "labels": {
            "__metrics_path__": found.path or "/metrics",
            "__scheme__": "https" if found.https else "http",
            "app": row.app,
            "region": row.region,
            "machine_id": row.id,
            "instance_id": row.instance_id,
            "worker": row.worker_id,
        },
    }


async def prometheus_targets(request: web.Request) -> web.Response:
    """Prometheus' HTTP service discovery: a list of target groups, from the catalog, of the
    machines the caller's token may read."""
    b = broker_of(request)
    q = request.query
    audience = audience_of(request)
    groups = []
    for row in b.fleet.machines(app=q.get("app") or None, region=q.get("region") or None):
        if not audience.sees(row.app, row.id, row.region):
            continue
        group = target(row)
        if group is not None:
            groups.append(group)
    groups.sort(key=lambda g: str(g["targets"]))
    return reply(groups)

"""Routes about the cluster rather than one app: its regions and their capacity, the market's
quote for N machines (nothing reserved), and every machine of an organisation. All read the
catalog's picture, which may be milliseconds old, as Fly's answers are "a point in time"."""

from __future__ import annotations

import base64
import binascii
from typing import get_args

from aiohttp import web

from souk.broker.api.params import flag
from souk.broker.placement import quote
from souk.broker.state import broker_of
from souk.models.catalog import MachineRow, WorkerRow
from souk.models.guest import SIZES, CpuKind, GuestConfig
from souk.models.machine import MachineState
from souk.models.platform import (
    OrgMachine,
    OrgMachinesResponse,
    PlacementsRequest,
    PlacementsResponse,
    RegionCapacity,
    RegionPlacement,
    RegionsResponse,
)
from souk.web import ApiError, audience_of, read_model, reply, whole

DEFAULT_LIMIT = 500
MAX_LIMIT = 1000
MAX_GUEST_QUERY = 1 << 31  # what a cpus or memory_mb query can say; the guest's own range judges


# Fly's size presets as guests: shared-cpu-Nx has 256 MB per cpu, performance-Nx 2 GB.
def _regions(b_regions: set[str], expression: str | None) -> list[str]:
    """The regions an expression names, in its order; every region for none or `any`."""
    names = [n.strip() for n in (expression or "").split(",") if n.strip()]
    if not names or names == ["any"]:
        return sorted(b_regions)
    unknown = [n for n in names if n not in b_regions]
    if unknown:
        known = ", ".join(sorted(b_regions)) or "none"
        raise ApiError(
            400, "invalid", f"region: no region {unknown[0]!r} in this cluster (regions: {known})"
        )
    return list(dict.fromkeys(names))


def _guest_from_query(request: web.Request) -> GuestConfig:
    q = request.query
    fields: dict[str, object] = {}
    size = q.get("size")
    if size:  # the presets machine creates take
        if size not in SIZES:
            raise ApiError(400, "invalid", f"size: one of {', '.join(SIZES)}")
        kind, cpus, memory_mb = SIZES[size]
        fields = {"cpu_kind": kind, "cpus": cpus, "memory_mb": memory_mb}
    for name in ("cpus", "memory_mb"):
        value = whole(request, name)
        if value is not None:
            fields[name] = value
    if q.get("cpu_kind"):
        if q["cpu_kind"] not in get_args(CpuKind):
            raise ApiError(400, "invalid", f"cpu_kind: one of {', '.join(get_args(CpuKind))}")
        fields["cpu_kind"] = q["cpu_kind"]
    if q.get("gpus") not in (None, "", "0") or q.get("gpu_kind"):
        raise ApiError(400, "invalid", "gpus: souk workers offer no GPUs")
    try:
        return GuestConfig.model_validate(fields)
    except ValueError as exc:
        raise ApiError(400, "invalid", f"guest: {exc}") from None


async def regions(request: web.Request) -> web.Response:
    """Every region with reachable workers, and how many machines of the guest asked (souk's
    default guest when none is) it could take now."""
    b = broker_of(request)
    guest = _guest_from_query(request)
    by_region: dict[str, list[WorkerRow]] = {}
    for row in b.fleet.workers():
        by_region.setdefault(row.region, []).append(row)
    out = [
        RegionCapacity(
            code=name,
            name=name,
            capacity=quote.capacity(rows, guest),
            workers=len(rows),
        )
        for name, rows in sorted(by_region.items())
    ]
    return reply(RegionsResponse(regions=out))


async def placements(request: web.Request) -> web.Response:
    """With `count`, where that many machines would go, region by region in the order asked
    (the next region takes what the one before could not); with none, how many each region
    could take. Nothing is reserved: a create that follows may still find the room gone."""
    b = broker_of(request)
    body = await read_model(request, PlacementsRequest)
    if body.volume_name or body.volume_size_bytes:
        raise ApiError(400, "invalid", "volume_name: placement by volume is not supported")
    if body.weights:
        raise ApiError(
            400, "invalid", "weights: souk places by its broker's policy; send no weights"
        )
    guest = body.compute or GuestConfig()
    rows = b.fleet.workers()
    names = _regions({r.region for r in rows}, body.region)
    out: list[RegionPlacement] = []
    left = body.count
    for name in names:
        in_region = [r for r in rows if r.region == name]
        if body.count == 0:
            out.append(RegionPlacement(region=name, count=quote.capacity(in_region, guest)))
            continue
        if left == 0:
            break
        placed = sum(quote.place_many(in_region, guest, left, b.placer.policy).values())
        if placed:
            out.append(RegionPlacement(region=name, count=placed))
            left -= placed
    return reply(PlacementsResponse(regions=out))


def _cursor(row: MachineRow) -> str:
    return base64.urlsafe_b64encode(f"{row.updated_at}\n{row.id}".encode()).decode()


def _after(cursor: str) -> tuple[str, str]:
    try:
        updated_at, _, mid = base64.urlsafe_b64decode(cursor.encode()).decode().partition("\n")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ApiError(400, "invalid", "cursor: as a next_cursor gave it") from None
    if not mid:
        raise ApiError(400, "invalid", "cursor: as a next_cursor gave it")
    return updated_at, mid


async def org_machines(request: web.Request) -> web.Response:
    """The organisation's machines the token may see, oldest change first, a page at a time."""
    b = broker_of(request)
    audience = audience_of(request)
    org = request.match_info["org"]
    q = request.query
    include = flag(request, "include_deleted")
    region = q.get("region") or None
    states = {s for s in q.get("state", "").split(",") if s}
    unknown = states - set(get_args(MachineState))
    if unknown:
        raise ApiError(400, "invalid", f"state: unknown state {sorted(unknown)[0]!r}")
    limit = whole(request, "limit", DEFAULT_LIMIT)
    after: tuple[str, str] | None = None
    if q.get("cursor"):
        after = _after(q["cursor"])
    elif q.get("updated_after"):
        after = (q["updated_after"], "")
    in_org = {a.name for a in b.fleet.apps() if a.org == org}
    rows = sorted(
        (
            m
            for m in b.fleet.machines(region=region)
            if m.app in in_org
            and (include or m.state != "destroyed")
            and (not states or m.state in states)
            and (after is None or (m.updated_at, m.id) > after)
            and audience.sees(m.app, m.id, m.region)
        ),
        key=lambda m: (m.updated_at, m.id),
    )
    page = rows[:limit]
    body = OrgMachinesResponse(
        machines=[
            OrgMachine(
                id=m.id,
                name=m.name or m.id,
                app_name=m.app,
                state=m.state,
                region=m.region,
                instance_id=m.instance_id,
                private_ip=m.private_ip,
                updated_at=m.updated_at,
            )
            for m in page
        ],
    )
    if page:
        body.last_machine_id, body.last_updated_at = page[-1].id, page[-1].updated_at
        if len(rows) > limit:
            body.next_cursor = _cursor(page[-1])
    return reply(body.model_dump(exclude_none=True))

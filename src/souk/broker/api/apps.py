"""Apps and their metadata, kept by the app registry, their one writer: a broker that hosts it
writes there, any other forwards the write to the one that does."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from souk.broker.api.errors import refusal
from souk.broker.auth import grant_of
from souk.broker.registry import AppExists, AppNotFound, MetadataRefused
from souk.broker.state import Broker, broker_of, sealer_of
from souk.broker.tokens import Scope
from souk.models.api import App, AppOrganization, CreateAppRequest, ListAppsResponse
from souk.models.catalog import AppRow
from souk.models.machine import MetadataChange
from souk.sealing import Unsealable
from souk.web import ApiError, audience_of, read_model, reply


def app_view(b: Broker, row: AppRow) -> App:
    count = sum(1 for m in b.fleet.machines(app=row.name) if m.state != "destroyed")
    return App(
        id=row.name,
        name=row.name,
        created_at=row.created_at,
        machine_count=count,
        organization=AppOrganization(slug=row.org, name=row.org),
    )


async def forward_registry(
    request: web.Request, method: str, path: str, body: Any = None
) -> web.Response:
    """The request, sent on to the broker that hosts the app registry; its answer as it is."""
    b = broker_of(request)
    if not b.registry_url:
        raise ApiError(503, "no_app_registry", "this broker has no app registry configured")
    headers = {"Authorization": request.headers.get("Authorization", "")}
    try:
        async with b.client.session.request(
            method, b.registry_url + path, json=body, headers=headers
        ) as resp:
            return web.Response(
                body=await resp.read(), status=resp.status, content_type="application/json"
            )
    except aiohttp.ClientError as exc:
        raise ApiError(503, "no_app_registry", f"the app registry is unreachable: {exc}") from exc


async def list_apps(request: web.Request) -> web.Response:
    b = broker_of(request)
    audience = audience_of(request)
    org = request.query.get("org_slug")
    apps = [
        app_view(b, r)
        for r in sorted(b.fleet.apps(), key=lambda r: r.name)
        if audience.sees(r.name) and org in (None, r.org)
    ]
    return reply(ListAppsResponse(total_apps=len(apps), apps=apps))


async def create_app(request: web.Request) -> web.Response:
    b = broker_of(request)
    body = await read_model(request, CreateAppRequest)
    if b.registry is None:
        return await forward_registry(request, "POST", "/v1/apps", body.model_dump())
    try:
        row = b.registry.create(body.name, body.org_slug, body.network)
    except AppExists:
        raise ApiError(409, "already_exists", f"app {body.name} already exists") from None
    return reply(app_view(b, row), status=201)


async def get_app(request: web.Request) -> web.Response:
    b = broker_of(request)
    return reply(app_view(b, b.require_app(request.match_info["app"])))


async def delete_app(request: web.Request) -> web.Response:
    b = broker_of(request)
    name = request.match_info["app"]
    b.require_app(name)
    live = [m.id for m in b.fleet.machines(app=name) if m.state != "destroyed"]
    if live:
        raise ApiError(
            409,
            "has_machines",
            f"app {name} still has {len(live)} machines; destroy them first",
            {"machines": live[:20]},
        )
    if b.registry is None:
        return await forward_registry(request, "DELETE", f"/v1/apps/{name}")
    b.registry.delete(name)
    return web.Response(status=202)


def shown_metadata(request: web.Request, name: str, metadata: dict[str, str]) -> web.Response:
    """The app's metadata for this caller: sealed values opened if its token may deploy the
    app, left out if not (see `souk.sealing`)."""
    may_open = grant_of(request).permits(Scope("deploy", app=name))
    try:
        return reply(sealer_of(request).shown(name, metadata, may_open))
    except Unsealable as exc:
        raise ApiError(500, "sealed_unreadable", str(exc), {"key": exc.key}) from None


async def get_app_metadata(request: web.Request) -> web.Response:
    b = broker_of(request)
    name = request.match_info["app"]
    if b.registry is not None:
        try:
            return shown_metadata(request, name, b.registry.metadata(name))
        except AppNotFound:
            raise ApiError(404, "not_found", f"app {name} not found") from None
    if b.registry_url:  # read from the writer: a deploy reads what it just wrote
        return await forward_registry(request, "GET", f"/v1/apps/{name}/metadata")
    return shown_metadata(request, name, dict(b.require_app(name).metadata))


async def patch_app_metadata(request: web.Request) -> web.Response:
    """Values of sealed keys are sealed by the broker that hosts the registry, just before it
    stores them; one that forwards the patch sends them on as they came."""
    b = broker_of(request)
    name = request.match_info["app"]
    body = await read_model(request, MetadataChange)
    if b.registry is None:
        path = f"/v1/apps/{name}/metadata"
        return await forward_registry(request, "PATCH", path, body.model_dump())
    stored = sealer_of(request).seal_changes(name, body.set)
    try:
        return shown_metadata(request, name, b.registry.patch_metadata(name, stored, body.delete))
    except AppNotFound:
        raise ApiError(404, "not_found", f"app {name} not found") from None
    except MetadataRefused as exc:
        raise refusal(exc) from None

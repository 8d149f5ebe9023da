"""Routes of the cluster as a whole: tokens, the platform's view of regions and placements,
workers, metrics and the dashboard."""

from __future__ import annotations

from typing import Any

from souk.broker.api import (
    fleet,
    observe,
    platform,
    tokens,
)
from souk.broker.api.routes.common import APP
from souk.broker.ui import pages as ui
from souk.models.api import (
    WorkerInfo,
)
from souk.models.catalog import RevocationRow
from souk.models.platform import (
    CurrentToken,
    DeployTokenRequest,
    DeployTokenResponse,
    OrgMachinesResponse,
    PlacementsRequest,
    PlacementsResponse,
    RegionsResponse,
)
from souk.web import Number, Permission, Route, in_query

PUBLIC = Permission.public()

ROUTES: list[Route] = [
    Route(
        "POST",
        "/v1/apps/{app}/deploy_token",
        tokens.deploy_token,
        "The caller's token limited to this app (and to an expiry)",
        DeployTokenRequest,
        DeployTokenResponse,
        errors=(404,),
        permission=Permission.app_deploy(APP),
    ),
    # The cluster as a whole (platform)
    Route(
        "GET",
        "/v1/orgs/{org}/machines",
        platform.org_machines,
        "An organisation's machines across its apps (those the token may see), a page at a time",
        response=OrgMachinesResponse,
        query={
            "include_deleted": "also destroyed machines",
            "region": "only this region",
            "state": "comma-separated states",
            "updated_after": "RFC 3339 time",
            "cursor": "next_cursor of the page before",
            "limit": Number(
                f"machines per page, default {platform.DEFAULT_LIMIT}", 1, platform.MAX_LIMIT
            ),
        },
        permission=Permission.app_read(own_rows=True),
    ),
    Route(
        "GET",
        "/v1/platform/regions",
        platform.regions,
        "Regions and how many machines of a guest each could take now",
        response=RegionsResponse,
        query={
            "size": "shared-cpu-Nx or performance-Nx",
            "cpu_kind": "shared or performance",
            "cpus": Number("cpus per machine", 0, platform.MAX_GUEST_QUERY),
            "memory_mb": Number("memory per machine", 0, platform.MAX_GUEST_QUERY),
        },
        permission=Permission.token(),
    ),
    Route(
        "POST",
        "/v1/platform/placements",
        platform.placements,
        "Where N machines of a guest would go now, by region; nothing is reserved",
        PlacementsRequest,
        PlacementsResponse,
        permission=Permission.token(),
    ),
    Route(
        "GET",
        "/v1/workers",
        fleet.list_workers,
        "Workers (operator tokens only)",
        response=list[WorkerInfo],
        errors=(403,),
        query={"region": "only this region"},
        permission=Permission.operator("read"),
    ),
    Route(
        "POST",
        "/v1/workers/{worker}/cordon",
        fleet.cordon_worker,
        "Cordon a worker: no new machines (operator)",
        errors=(403, 404),
        permission=Permission.operator("write"),
    ),
    Route(
        "POST",
        "/v1/workers/{worker}/uncordon",
        fleet.cordon_worker,
        "Uncordon a worker (operator)",
        errors=(403, 404),
        permission=Permission.operator("write"),
    ),
    Route(
        "GET",
        "/v1/tokens/current",
        tokens.current,
        "What the token presented allows",
        response=CurrentToken,
        permission=Permission.token(),
    ),
    Route(
        "GET",
        "/v1/tokens/revoked",
        tokens.revoked,
        "Revoked token ids (operator)",
        response=list[RevocationRow],
        errors=(403, 503),
        permission=Permission.operator("read"),
    ),
    Route(
        "DELETE",
        # not the paths of the routes above: DELETE there is not allowed (405), as documented
        "/v1/tokens/{id:(?!current$|revoked$)[^/]+}",
        tokens.revoke,
        "Revoke a token id and every token attenuated from it (operator); idempotent",
        response=RevocationRow,
        errors=(403, 503),
        permission=Permission.operator("write"),
    ),
    Route(
        "GET",
        "/metrics",
        observe.metrics,
        "Prometheus metrics of this broker and its catalog replica (text format)",
        permission=Permission.operator("read"),
    ),
    Route(
        "GET",
        "/v1/prometheus/targets",
        observe.prometheus_targets,
        "Machines' own metrics (config.metrics), for Prometheus' HTTP service discovery",
        response=list[dict[str, Any]],
        query={"app": "only this app", "region": "only this region"},
        permission=Permission.app_read(in_query("app"), region=in_query("region"), own_rows=True),
    ),
    # The dashboard (souk.broker.ui): pages for operators, reached with a bearer token or the
    # login cookie; the login form and the static files are public.
    Route("GET", "/ui", ui.fleet_page, "Dashboard: the fleet", permission=Permission.operator()),
    Route("GET", "/ui/apps", ui.apps_page, "Dashboard: apps", permission=Permission.operator()),
    Route(
        "GET",
        "/ui/apps/{app}",
        ui.app_page,
        "Dashboard: an app's machines, releases and events",
        errors=(404,),
        permission=Permission.operator(),
    ),
    Route(
        "GET",
        "/ui/apps/{app}/machines/{id}",
        ui.machine_page,
        "Dashboard: a machine and its placement explained",
        errors=(404,),
        permission=Permission.operator(),
    ),
    Route(
        "GET",
        "/ui/events",
        ui.events,
        "Dashboard: server-sent events when the catalog changes",
        permission=Permission.operator(),
    ),
    Route("GET", "/ui/login", ui.login_form, "Dashboard: log in", permission=PUBLIC),
    Route(
        "POST",
        "/ui/login",
        ui.login,
        "Dashboard: keep a token in an HttpOnly cookie, then to the fleet page",
        status=303,
        errors=(400,),
        permission=PUBLIC,
    ),
    Route("POST", "/ui/logout", ui.logout, "Dashboard: log out", status=303, permission=PUBLIC),
    *(
        Route("GET", f"/ui/static/{name}", ui.static, f"Dashboard: {name}", permission=PUBLIC)
        for name in ui.STATIC
    ),
]

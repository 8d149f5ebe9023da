"""The proxy's own routes, answered for requests that name no app: its health (public) and its
status (machines in flight and counters: operators only). They are declared like every souk
route, each with the `Permission` it needs, and checked here against that declaration.

The proxy holds no cluster secret (it would let anyone who takes the proxy mint operator
tokens), so it cannot verify a token alone: it asks a broker what the token allows
(`GET /v1/tokens/current`), which checks the signature, the expiry and the revocations, and
judges the route's permission on that answer. Proxy routes need nothing, or an operator. That
question goes over a client of its own, which trusts what the proxy's broker client trusts (the
cluster's CA, given one), never over the backends' connections.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from souk.clients.http import ClientError, HttpClient, Tls
from souk.models.api import TokenInfo
from souk.web import Permission, Route
from souk.web.errors import json_error
from souk.web.metrics import METRICS_PATH, Metrics, serve_metrics

HEALTH_PATH = "/.souk/health"
STATUS_PATH = "/.souk/status"
CHECK_TIMEOUT = 10.0


def own_routes(status: Callable[[], dict[str, Any]], metrics: Metrics | None = None) -> list[Route]:
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def show_status(_: web.Request) -> web.Response:
        return web.json_response(status())

    observed = (
        []
        if metrics is None
        else [
            Route(
                "GET",
                METRICS_PATH,
                serve_metrics(metrics),
                "Prometheus metrics (text format)",
                permission=Permission.operator("read"),
            )
        ]
    )
    return [
        *observed,
        Route("GET", HEALTH_PATH, health, "Whether it runs", permission=Permission.public()),
        Route(
            "GET",
            STATUS_PATH,
            show_status,
            "Requests in flight per machine, and counters",
            permission=Permission.operator("read"),
        ),
    ]


def fleet_denial(permission: Permission, info: TokenInfo) -> str | None:
    """Why the token may not call a route of the proxy, or None. The proxy's routes are fleet
    routes, and a token may do a fleet operation as the broker says (see docs/tokens.md)."""
    if permission.need not in ("token", "operator"):
        raise ValueError(f"a proxy route cannot need {permission.describe()}")
    if permission.need == "token":
        return None
    if not info.operator:
        return "this route needs an operator token"
    if info.apps is not None or info.machines is not None or info.regions is not None:
        return "this token is limited to some apps, machines or regions; this route spans all"
    if permission.action not in info.actions:
        return f"this token does not allow {permission.action}"
    return None


class OwnRoutes:
    """The proxy's own route table, served behind the permission each route declares."""

    def __init__(self, routes: Sequence[Route], api: str, ca: Path | None = None) -> None:
        """`ca`: the CA an https broker's certificate is checked against (else the system's)."""
        for route in routes:
            if route.permission is None:
                raise ValueError(f"{route.method} {route.path} declares no permission")
            if route.permission.need == "app":
                raise ValueError(f"{route.path}: a proxy route belongs to no app")
        self.routes = {route.path: route for route in routes}
        trust = ssl.create_default_context(cafile=ca) if ca is not None else None
        self.broker = HttpClient(tls=Tls(trust=trust))
        self.api = api.rstrip("/")

    async def close(self) -> None:
        await self.broker.close()

    async def handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        if request.method not in (route.method, "HEAD"):
            response = json_error(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed on {route.path}; allowed: {route.method}",
                {"allowed": [route.method]},
            )
            response.headers["Allow"] = route.method
            return response
        assert route.permission is not None  # checked in __init__
        if route.permission.need != "public":
            refusal = await self._refusal(request, route.permission)
            if refusal is not None:
                return refusal
        return await route.handler(request)

    async def _refusal(self, request: web.Request, permission: Permission) -> web.Response | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() not in ("bearer", "flyv1") or not token.strip():
            return json_error(401, "unauthorized", "send a token: Authorization: Bearer <token>")
        headers = {"Authorization": f"Bearer {token.strip()}", "Accept-Encoding": "identity"}
        url = f"{self.api}/v1/tokens/current"
        try:
            payload = await self.broker.send(
                ClientError, "GET", url, headers=headers, timeout=CHECK_TIMEOUT
            )
        except ClientError as exc:
            if exc.http_status == 401:  # the broker's reason: malformed, expired, revoked...
                return json_error(401, exc.reason, exc.message)
            if exc.http_status == 0:
                return json_error(503, "broker_unreachable", f"cannot check the token: {exc}")
            return json_error(503, "broker_unreachable", f"the broker answered {exc.http_status}")
        try:
            info = TokenInfo.model_validate_json(payload)
        except ValidationError:
            return json_error(503, "broker_unreachable", "the broker's answer was not understood")
        denial = fleet_denial(permission, info)
        return None if denial is None else json_error(403, "forbidden", denial)

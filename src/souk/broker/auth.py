"""Bearer-token middleware: every request but `/openapi.json` carries a token, checked against
the cluster secret and the replicated list of revoked ids (no call on the request path, so any
broker checks any token), then against what the request touches (`Scope`).

The scope is worked out here, from the route, once for every handler: which kind of request it
is (read, write, deploy, or a fleet operation), and which app, machine and region it names. A
region is looked up for a machine, and read from the body for a create; a caveat on a dimension
the request does not name refuses it (see `Grant.denial`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from souk.broker.tokens import Action, Grant, Scope, TokenError, verify
from souk.web import ApiError, read_json
from souk.web.errors import Handler

PUBLIC = frozenset({"/openapi.json"})
INTROSPECTION = frozenset({("GET", "/v1/tokens/current"), ("HEAD", "/v1/tokens/current")})
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FLEET_PREFIXES = ("/v1/workers", "/v1/catalog", "/v1/tokens")
MACHINE_ROUTE = "/v1/apps/{app}/machines/{id}"
CREATE_APP = ("POST", "/v1/apps")
CREATE_MACHINE = ("POST", "/v1/apps/{app}/machines")
LIST_MACHINES = ("GET", "/v1/apps/{app}/machines")
DEPLOY = frozenset(
    {
        CREATE_APP,
        ("DELETE", "/v1/apps/{app}"),
        ("PATCH", "/v1/apps/{app}/metadata"),
        CREATE_MACHINE,
        ("POST", MACHINE_ROUTE),  # update: a new config
        ("DELETE", MACHINE_ROUTE),
    }
)
GRANT_KEY = web.RequestKey("grant", Grant)

MachineRegion = Callable[[str, str], str | None]  # (app, machine id) -> its region, if known
Revoked = Callable[[str], bool]


def grant_of(request: web.Request) -> Grant:
    return request[GRANT_KEY]


def route_of(request: web.Request) -> str:
    """The route's pattern, e.g. `/v1/apps/{app}/machines/{id}/stop`; the path if none matched."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


def action_of(method: str, route: str) -> Action:
    if method in READ_METHODS:
        return "read"
    return "deploy" if (method, route) in DEPLOY else "write"


async def scope_of(request: web.Request, grant: Grant, machine_region: MachineRegion) -> Scope:
    method, route = request.method, route_of(request)
    action = action_of(method, route)
    if route.startswith(FLEET_PREFIXES):
        return Scope(action, fleet=True)
    app = request.match_info.get("app")
    machine = request.match_info.get("id") if route.startswith(MACHINE_ROUTE) else None
    region: str | None = None
    if app is not None and machine is not None:
        region = machine_region(app, machine)
    elif (method, route) == LIST_MACHINES:
        region = request.query.get("region") or None  # the handler lists only that region
    elif (method, route) == CREATE_MACHINE and grant.regions is not None:
        region = _string(await read_json(request), "region")
    elif (method, route) == CREATE_APP and grant.apps is not None:
        app = _string(await read_json(request), "name")
    lists_apps = (method, route) == ("GET", "/v1/apps")
    return Scope(action, app=app, machine=machine, region=region, lists_apps=lists_apps)


def _string(body: Any, key: str) -> str | None:
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, str) else None


def make_auth(
    secret: bytes,
    revoked: Revoked | None = None,
    machine_region: MachineRegion | None = None,
) -> Middleware:
    def no_region(_app: str, _machine: str) -> str | None:
        return None

    region_of = machine_region or no_region

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC:
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() not in ("bearer", "flyv1") or not token.strip():
            raise ApiError(401, "unauthorized", "send a token: Authorization: Bearer <token>")
        try:
            grant = verify(token.strip(), secret, revoked=revoked)
        except TokenError as exc:
            raise ApiError(401, exc.reason, f"bad token: {exc.message}") from exc
        if (request.method, route_of(request)) not in INTROSPECTION:
            denial = grant.denial(await scope_of(request, grant, region_of))
            if denial is not None:
                raise ApiError(403, "forbidden", denial)
        request[GRANT_KEY] = grant
        return await handler(request)

    return auth

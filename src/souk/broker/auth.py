"""Bearer-token middleware: a token is checked against the cluster secret and the replicated
list of revoked ids (no call on the request path, so any broker checks any token), then against
what the matched route declares it needs (`souk.web.Permission`).

Nothing here knows a path: the route table is the one home of who may call what. From the
route's permission this works out the request's `Scope`: its kind (read, write, deploy, or a
fleet operation) and the app, machine and region it names, from the path, the query or the body
as the permission says. A machine's region is looked up, and the body is read only for a token
limited on the dimension it names. A caveat on a dimension the request does not name refuses it
(see `Grant.denial`).

A path that matches no route needs a valid token before it gets its 404 or 405, so that paths
cannot be probed without one; a matched route that declares no permission is closed to all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware

from souk.broker.tokens import Grant, Scope, TokenError, verify
from souk.web import AUDIENCE, ApiError, Audience, Permission, Route, declared_route, read_json
from souk.web.errors import Handler
from souk.web.routes import Named
from souk.web.streams import CREDENTIAL

GRANT_KEY = web.RequestKey("grant", Grant)
UNMATCHED = Permission.token()

MachineRegion = Callable[[str, str], str | None]  # (app, machine id) -> its region, if known
Revoked = Callable[[str], bool]


def grant_of(request: web.Request) -> Grant:
    return request[GRANT_KEY]


def permission_of(request: web.Request) -> Permission | None:
    """What the matched route declares; None for a route that declares nothing."""
    route = declared_route(request)
    if route is not None:
        return route.permission
    return UNMATCHED if request.match_info.route.resource is None else None


async def scope_of(
    request: web.Request, grant: Grant, permission: Permission, machine_region: MachineRegion
) -> Scope:
    async def named(where: Named | None, limited: bool) -> str | None:
        if where is None:
            return None
        if where.where == "path":
            return request.match_info.get(where.name)
        if where.where == "query":
            return request.query.get(where.name) or None
        if not limited:  # nothing checks it: the body is left to the handler
            return None
        body = await read_json(request)
        for name in (where.name, *where.aliases):
            value = body.get(name) if isinstance(body, dict) else None
            if value is not None:
                return value if isinstance(value, str) else None
        return None

    p = permission
    app = await named(p.app, grant.apps is not None)
    machine = await named(p.machine, grant.machines is not None)
    region: str | None = None
    if p.region is not None:
        region = await named(p.region, grant.regions is not None)
    elif app is not None and machine is not None and grant.regions is not None:
        region = machine_region(app, machine)
    return Scope(
        p.action,
        app=app,
        machine=machine,
        region=region,
        fleet=p.need == "operator",
        lists_apps=p.own_rows,
    )


def presented_token(request: web.Request) -> str:
    """The token the request carries, as sent (what a deploy token is attenuated from)."""
    return _credentials(request)


def _credentials(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() not in ("bearer", "flyv1") or not token.strip():
        raise ApiError(401, "unauthorized", "send a token: Authorization: Bearer <token>")
    return token.strip()


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
        permission = permission_of(request)
        if permission is not None and permission.need == "public":
            return await handler(request)
        token = _credentials(request)
        try:
            grant = verify(token, secret, revoked=revoked)
        except TokenError as exc:
            raise ApiError(401, exc.reason, f"bad token: {exc.message}") from exc
        if permission is None:
            raise ApiError(403, "forbidden", "this route declares no permission: it is closed")
        if permission.need != "token":
            denial = grant.denial(await scope_of(request, grant, permission, region_of))
            if denial is not None:
                raise ApiError(403, "forbidden", denial)
        request[GRANT_KEY] = grant
        request[AUDIENCE] = audience(grant)
        request[CREDENTIAL] = lambda: lapse(token, secret, revoked)
        return await handler(request)

    return auth


def lapse(token: str, secret: bytes, revoked: Revoked | None) -> tuple[str, str] | None:
    """Why a token that was let in no longer holds (revoked, expired), for the streams that
    outlive the request's check (`souk.web.streams`); None while it holds."""
    try:
        verify(token, secret, revoked=revoked)
    except TokenError as exc:
        return exc.reason, exc.message
    return None


def audience(grant: Grant) -> Audience:
    return Audience(grant.sees, fleet=grant.sees_fleet())


def undeclared(routes: Iterable[Route]) -> list[str]:
    """Routes of a table that declare no permission: each would be closed to every caller."""
    return [f"{r.method} {r.path}" for r in routes if r.permission is None]

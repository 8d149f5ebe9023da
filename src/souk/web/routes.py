"""Routes declared once, with their models and the permission each needs, so the server, its
/openapi.json and its access checks cannot disagree.

A route's `Permission` says what a caller's token must allow: nothing (public), any valid
token, a kind of request on an app (read, write, deploy), or a fleet operation (operators).
It also says where the request names its app, machine and region (a path or query parameter,
or a field of the body), since a token limited to some of those is checked against them. The
access middleware in front of the routes (the broker's `souk.broker.auth`) reads the matched
route's permission and nothing else: the route table is the one home of who may call what.

A route served over mutual TLS (the worker's) says instead which roles' certificates may call
it, in `roles` (checked with `souk.pki.mtls_roles`); the role middleware
(`souk.pki.role_middleware`) reads them from the matched route, and a route that names none, or
that was served without being declared here, is closed to every role.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from aiohttp import web
from pydantic import BaseModel, TypeAdapter

from souk.models.errors import ErrorBody
from souk.web.query import Number

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Need = Literal["public", "token", "app", "operator"]
Action = Literal["read", "write", "deploy"]


@dataclass(frozen=True)
class Named:
    """Where a request names something: a path parameter, a query parameter or a body field."""

    where: Literal["path", "query", "body"]
    name: str
    aliases: tuple[str, ...] = ()  # other names of the same body field, tried in order

    def __str__(self) -> str:
        return f"{self.where} {self.name}"


def in_path(name: str) -> Named:
    return Named("path", name)


def in_query(name: str) -> Named:
    return Named("query", name)


def in_body(name: str, *aliases: str) -> Named:
    return Named("body", name, aliases)


@dataclass(frozen=True)
class Permission:
    """What a route needs of the caller's token.

    `need`: "public" (no token), "token" (any valid token), "app" (a request of kind `action`
    on the app, machine and region it names), "operator" (a fleet operation of kind `action`).
    A token limited to some apps, machines or regions is refused a request that does not name
    them, except on routes with `own_rows`, whose handlers show only the rows of the token's
    apps (see `Audience`)."""

    need: Need
    action: Action = "read"
    app: Named | None = None
    machine: Named | None = None
    region: Named | None = None  # None with `machine`: the region the machine is in
    own_rows: bool = False

    def __post_init__(self) -> None:
        named = (self.app, self.machine, self.region, self.own_rows)
        if self.need != "app" and any(named):
            raise ValueError(f"a {self.need} permission names no app, machine or region")
        if self.need in ("public", "token") and self.action != "read":
            raise ValueError(f"a {self.need} permission has no action")

    @classmethod
    def public(cls) -> Permission:
        return cls("public")

    @classmethod
    def token(cls) -> Permission:
        return cls("token")

    @classmethod
    def app_read(
        cls,
        app: Named | None = None,
        machine: Named | None = None,
        region: Named | None = None,
        own_rows: bool = False,
    ) -> Permission:
        return cls("app", "read", app, machine, region, own_rows)

    @classmethod
    def app_write(
        cls, app: Named | None = None, machine: Named | None = None, region: Named | None = None
    ) -> Permission:
        return cls("app", "write", app, machine, region)

    @classmethod
    def app_deploy(
        cls, app: Named | None = None, machine: Named | None = None, region: Named | None = None
    ) -> Permission:
        return cls("app", "deploy", app, machine, region)

    @classmethod
    def operator(cls, action: Action = "read") -> Permission:
        return cls("operator", action)

    def describe(self) -> str:
        """One line for people: what the route needs, and where it finds the names."""
        if self.need == "public":
            return "public"
        if self.need == "token":
            return "any valid token"
        if self.need == "operator":
            return f"operator token ({self.action})"
        names = [
            f"{what} from {named}"
            for what, named in (
                ("app", self.app),
                ("machine", self.machine),
                ("region", self.region),
            )
            if named is not None
        ]
        if self.own_rows:
            names.append("shows only the token's apps")
        return f"app {self.action}" + (f" ({'; '.join(names)})" if names else "")


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    body: type[BaseModel] | None = None
    response: Any = None  # a model, or a typing form such as list[Model]
    status: int = 200
    # name -> description, or a `Number` (read with `number`: range-checked)
    query: dict[str, str | Number] = field(default_factory=dict)
    errors: tuple[int, ...] = ()
    permission: Permission | None = None  # None: an access middleware refuses every caller
    roles: frozenset[str] = frozenset()  # mTLS roles that may call it; none: closed to all


# --- who a route answers to -----------------------------------------------------------------


@dataclass(frozen=True)
class Audience:
    """Whose rows a route with `own_rows` may show: the access middleware sets it for every
    request it lets through, from the caller's token."""

    can_see: Callable[[str, str | None, str | None], bool]  # (app, machine, region)
    fleet: bool  # rows that belong to no app (workers, images, revocations): operators only

    def sees(self, app: str, machine: str | None = None, region: str | None = None) -> bool:
        return self.can_see(app, machine, region)


EVERYONE = Audience(lambda _app, _machine, _region: True, fleet=True)
AUDIENCE = web.RequestKey("audience", Audience)


def audience_of(request: web.Request) -> Audience:
    """The caller's audience. Served with no access middleware in front, a route that filters
    by it fails (500) rather than show everything by mistake."""
    if AUDIENCE not in request:
        raise RuntimeError(f"{request.path}: no access middleware set the caller's audience")
    return request[AUDIENCE]


@web.middleware
async def open_access(request: web.Request, handler: Handler) -> web.StreamResponse:
    """For a server that checks no tokens at all (bound to a private address): everyone sees
    every row."""
    request[AUDIENCE] = EVERYONE
    return await handler(request)


# --- serving the table -------------------------------------------------------------------------

DECLARED = web.AppKey("declared_routes", dict[tuple[str, str], Route])


def declared_route(request: web.Request) -> Route | None:
    """The declared route the request matched (a HEAD matches its GET), if any."""
    resource = request.match_info.route.resource
    if resource is None:
        return None
    if DECLARED not in request.app:
        return None
    table = request.app[DECLARED]
    found = table.get((request.method, resource.canonical))
    if found is None and request.method == "HEAD":
        found = table.get(("GET", resource.canonical))
    return found


def _declared(request: web.Request, name: str, whole: bool) -> float | None:
    route = declared_route(request)
    spec = route.query.get(name) if route is not None else None
    if not isinstance(spec, Number) or spec.whole != whole:
        kind = "whole-number" if whole else "numeric"
        raise RuntimeError(f"{request.path}: no {kind} query parameter {name!r} is declared")
    text = request.query.get(name, "")
    return None if text == "" else spec.parse(name, text)


@overload
def whole(request: web.Request, name: str, default: int) -> int: ...
@overload
def whole(request: web.Request, name: str, default: None = None) -> int | None: ...
def whole(request: web.Request, name: str, default: int | None = None) -> int | None:
    """The query parameter `name` as the matched route declares it (a whole `Number`);
    `default` if absent or empty. A 400 `invalid` naming it when out of its declared range."""
    value = _declared(request, name, whole=True)
    return default if value is None else int(value)


@overload
def number(request: web.Request, name: str, default: float) -> float: ...
@overload
def number(request: web.Request, name: str, default: None = None) -> float | None: ...
def number(request: web.Request, name: str, default: float | None = None) -> float | None:
    """`whole`, for a parameter declared as a `Number` with fractions (seconds and the like)."""
    value = _declared(request, name, whole=False)
    return default if value is None else value


def add_routes(
    app: web.Application,
    routes: Sequence[Route],
    title: str,
    version: str,
    openapi_roles: frozenset[str] = frozenset(),
) -> None:
    """Serve the routes and their /openapi.json (`openapi_roles`: who may read it over mutual
    TLS), and declare them for the middlewares that read the matched route."""

    # Written on first request, not at start: generating the models' schemas would otherwise
    # lengthen every start, a restart after a crash included (docs/benchmarks.md, "The OpenAPI
    # document, on its first request").
    @functools.cache
    def document() -> bytes:
        return json.dumps(openapi_document(routes, title, version)).encode()

    async def serve_openapi(_: web.Request) -> web.Response:
        return web.Response(body=document(), content_type="application/json")

    openapi = Route(
        "GET",
        "/openapi.json",
        serve_openapi,
        "This document",
        permission=Permission.public(),
        roles=openapi_roles,
    )
    table = app[DECLARED].copy() if DECLARED in app else {}
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler)
    app.router.add_get(openapi.path, openapi.handler)
    for route in [*routes, openapi]:
        resource = _PATH_PARAM.sub(r"{\1}", route.path)
        table[(route.method, resource)] = route
    app[DECLARED] = table


def undeclared(app: web.Application) -> list[str]:
    """The app's routes ("METHOD /path/{var}") served but not declared with `add_routes`: no
    middleware reading the matched route lets anyone call them."""
    table = app.get(DECLARED, {})
    missing = []
    for route in app.router.routes():
        if route.resource is None or route.method == "HEAD":
            continue
        if (route.method, route.resource.canonical) not in table:
            missing.append(f"{route.method} {route.resource.canonical}")
    return missing


def reply(value: Any, status: int = 200) -> web.Response:
    """JSON response from a model, a list of models or plain data."""
    if isinstance(value, BaseModel):
        text = value.model_dump_json(exclude_none=False)
    elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
        text = "[" + ",".join(v.model_dump_json() for v in value) + "]"
    else:
        text = json.dumps(value)
    return web.Response(text=text, status=status, content_type="application/json")


_PATH_PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")


def _refusals(permission: Permission | None) -> tuple[int, ...]:
    """What a server checking callers may answer before the handler runs: 401 (no or bad
    credentials) and 403 (they do not allow this request), on every route but public ones."""
    return () if permission is not None and permission.need == "public" else (401, 403)


def openapi_document(routes: Sequence[Route], title: str, version: str) -> dict[str, Any]:
    """OpenAPI 3.1 from the route table and the pydantic models' JSON Schemas."""
    schemas: dict[str, Any] = {}

    def schema_ref(kind: Any) -> dict[str, Any]:
        adapter = TypeAdapter(kind)
        schema = adapter.json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            schemas[kind.__name__] = schema
            return {"$ref": f"#/components/schemas/{kind.__name__}"}
        return schema

    error_ref = schema_ref(ErrorBody)
    paths: dict[str, Any] = {}
    for route in routes:
        path = _PATH_PARAM.sub(r"{\1}", route.path)
        params: list[dict[str, Any]] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PATH_PARAM.findall(route.path)
        ]
        params += [
            {
                "name": name,
                "in": "query",
                "required": False,
                "description": text.description if isinstance(text, Number) else text,
                "schema": text.schema() if isinstance(text, Number) else {"type": "string"},
            }
            for name, text in route.query.items()
        ]
        op: dict[str, Any] = {"summary": route.summary, "parameters": params, "responses": {}}
        if route.permission is not None:
            op["x-souk-permission"] = route.permission.describe()
        if route.body is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema_ref(route.body)}},
            }
        ok: dict[str, Any] = {"description": "success"}
        if route.response is not None:
            ok["content"] = {"application/json": {"schema": schema_ref(route.response)}}
        op["responses"][str(route.status)] = ok
        for code in sorted({400, *route.errors, *_refusals(route.permission)}):
            op["responses"][str(code)] = {
                "description": "error",
                "content": {"application/json": {"schema": error_ref}},
            }
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }

"""Routes declared once, with their models, so the server and /openapi.json cannot disagree."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, TypeAdapter

from souk.models.errors import ErrorBody

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    body: type[BaseModel] | None = None
    response: Any = None  # a model, or a typing form such as list[Model]
    status: int = 200
    query: dict[str, str] = field(default_factory=dict)  # name -> description
    errors: tuple[int, ...] = ()


def add_routes(app: web.Application, routes: Sequence[Route], title: str, version: str) -> None:
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler)
    document = openapi_document(routes, title, version)

    async def serve_openapi(_: web.Request) -> web.Response:
        return web.json_response(document)

    app.router.add_get("/openapi.json", serve_openapi)


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
                "description": text,
                "schema": {"type": "string"},
            }
            for name, text in route.query.items()
        ]
        op: dict[str, Any] = {"summary": route.summary, "parameters": params, "responses": {}}
        if route.body is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema_ref(route.body)}},
            }
        ok: dict[str, Any] = {"description": "success"}
        if route.response is not None:
            ok["content"] = {"application/json": {"schema": schema_ref(route.response)}}
        op["responses"][str(route.status)] = ok
        for code in sorted({400, *route.errors}):
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

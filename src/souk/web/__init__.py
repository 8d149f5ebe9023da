"""HTTP plumbing shared by the worker, the broker and the proxy: JSON errors, validated bodies,
a declared route table (with the permission each route needs) and the OpenAPI document
generated from it."""

from souk.web.body import read_json, read_model
from souk.web.errors import ApiError, error_middleware, json_error
from souk.web.query import Number
from souk.web.routes import (
    AUDIENCE,
    EVERYONE,
    Audience,
    Permission,
    Route,
    add_routes,
    audience_of,
    declared_route,
    in_body,
    in_path,
    in_query,
    number,
    open_access,
    openapi_document,
    reply,
    undeclared,
    whole,
)
from souk.web.server import JsonErrorRunner, runner

__all__ = [
    "AUDIENCE",
    "EVERYONE",
    "ApiError",
    "Audience",
    "JsonErrorRunner",
    "Number",
    "Permission",
    "Route",
    "add_routes",
    "audience_of",
    "declared_route",
    "error_middleware",
    "in_body",
    "in_path",
    "in_query",
    "json_error",
    "number",
    "open_access",
    "openapi_document",
    "read_json",
    "read_model",
    "reply",
    "runner",
    "undeclared",
    "whole",
]

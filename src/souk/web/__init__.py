"""HTTP plumbing shared by the worker, the broker and the proxy: JSON errors, validated bodies,
a declared route table and the OpenAPI document generated from it."""

from souk.web.body import read_json, read_model
from souk.web.errors import ApiError, error_middleware, json_error
from souk.web.routes import Route, add_routes, openapi_document, reply
from souk.web.server import JsonErrorRunner, runner

__all__ = [
    "ApiError",
    "JsonErrorRunner",
    "Route",
    "add_routes",
    "error_middleware",
    "json_error",
    "openapi_document",
    "read_json",
    "read_model",
    "reply",
    "runner",
]

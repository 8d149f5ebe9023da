"""HTTP plumbing shared by the worker, the broker and the proxy: JSON errors, validated bodies,
a declared route table and the OpenAPI document generated from it."""

from souk.web.errors import ApiError, error_middleware, json_error
from souk.web.routes import Route, add_routes, openapi_document, read_json, read_model, reply

__all__ = [
    "ApiError",
    "Route",
    "add_routes",
    "error_middleware",
    "json_error",
    "openapi_document",
    "read_json",
    "read_model",
    "reply",
]

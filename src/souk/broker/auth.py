"""Bearer-token middleware: every request but `/openapi.json` carries a token, checked against
the cluster secret alone (no database, so any broker checks any token)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from souk.broker.tokens import Grant, TokenError, verify
from souk.web import ApiError
from souk.web.errors import Handler

PUBLIC = frozenset({"/openapi.json"})
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
GRANT_KEY = web.RequestKey("grant", Grant)


def grant_of(request: web.Request) -> Grant:
    return request[GRANT_KEY]


def make_auth(secret: bytes) -> Middleware:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC:
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() not in ("bearer", "flyv1") or not token.strip():
            raise ApiError(401, "unauthorized", "send a token: Authorization: Bearer <token>")
        try:
            grant = verify(token.strip(), secret)
        except TokenError as exc:
            raise ApiError(401, "unauthorized", f"bad token: {exc}") from exc
        app = request.match_info.get("app")
        write = request.method not in READ_METHODS
        if not grant.allows(app, write):
            raise ApiError(403, "forbidden", grant.why_not(app, write))
        request[GRANT_KEY] = grant
        return await handler(request)

    return auth

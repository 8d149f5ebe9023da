"""The token endpoints: what a token allows (any valid token), and revocation (operators).

Revocations are written by the app registry, like apps; a broker without it forwards there, and
every broker learns of a revocation from the catalog within milliseconds.
"""

from __future__ import annotations

from aiohttp import web

from souk.broker.api.apps import forward_registry
from souk.broker.api.state import broker_of
from souk.broker.auth import grant_of
from souk.broker.tokens import TOKEN_ID, Grant
from souk.models.api import TokenInfo
from souk.web import ApiError, reply


def token_info(grant: Grant) -> TokenInfo:
    def listed(names: frozenset[str] | None) -> list[str] | None:
        return None if names is None else sorted(names)

    return TokenInfo(
        id=grant.token_id,
        operator=grant.operator,
        actions=sorted(grant.actions),
        apps=listed(grant.apps),
        machines=listed(grant.machines),
        regions=listed(grant.regions),
        expires=grant.expires,
    )


async def current(request: web.Request) -> web.Response:
    return reply(token_info(grant_of(request)))


async def revoke(request: web.Request) -> web.Response:
    token_id = request.match_info["id"]
    if not TOKEN_ID.fullmatch(token_id):
        raise ApiError(400, "invalid", "id: a token id, 16 hex digits (souk tokens inspect)")
    registry = broker_of(request).registry
    if registry is None:
        return await forward_registry(request, "DELETE", request.path)
    return reply(registry.revoke(token_id))


async def revoked(request: web.Request) -> web.Response:
    registry = broker_of(request).registry
    if registry is None:
        return await forward_registry(request, "GET", request.path)
    return reply(registry.revocations())

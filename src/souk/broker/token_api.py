"""The token endpoints: what a token allows (any valid token), and revocation (operators).

Revocations are written by the app registry, like apps; a broker without it forwards there, and
every broker learns of a revocation from the catalog within milliseconds.
"""

from __future__ import annotations

from typing import Protocol

import aiohttp
from aiohttp import web

from souk.broker.auth import grant_of
from souk.broker.registry import AppRegistry
from souk.broker.tokens import TOKEN_ID, Grant
from souk.broker.workers import WorkerClient
from souk.models.api import TokenInfo
from souk.models.catalog import RevocationRow
from souk.web import ApiError, Route, reply


class TokenHost(Protocol):
    """What these routes need of a broker."""

    registry: AppRegistry | None
    registry_url: str | None
    client: WorkerClient


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


def routes(host: TokenHost) -> list[Route]:
    def require_operator(request: web.Request) -> None:
        if not grant_of(request).operator:  # the middleware refuses first; said twice on purpose
            raise ApiError(403, "forbidden", "revocation needs an operator token")

    async def forward(request: web.Request) -> web.Response:
        if not host.registry_url:
            raise ApiError(503, "no_app_registry", "this broker has no app registry configured")
        headers = {"Authorization": request.headers.get("Authorization", "")}
        try:
            async with host.client.session.request(
                request.method, host.registry_url + request.path, headers=headers
            ) as resp:
                return web.Response(
                    body=await resp.read(), status=resp.status, content_type="application/json"
                )
        except aiohttp.ClientError as exc:
            raise ApiError(
                503, "no_app_registry", f"the app registry is unreachable: {exc}"
            ) from exc

    async def current(request: web.Request) -> web.Response:
        return reply(token_info(grant_of(request)))

    async def revoke(request: web.Request) -> web.Response:
        require_operator(request)
        token_id = request.match_info["id"]
        if not TOKEN_ID.fullmatch(token_id):
            raise ApiError(400, "invalid", "id: a token id, 16 hex digits (souk tokens inspect)")
        if host.registry is None:
            return await forward(request)
        return reply(host.registry.revoke(token_id))

    async def revoked(request: web.Request) -> web.Response:
        require_operator(request)
        if host.registry is None:
            return await forward(request)
        return reply(host.registry.revocations())

    return [
        Route(
            "GET",
            "/v1/tokens/current",
            current,
            "What the token presented allows",
            response=TokenInfo,
        ),
        Route(
            "GET",
            "/v1/tokens/revoked",
            revoked,
            "Revoked token ids (operator)",
            response=list[RevocationRow],
            errors=(403, 503),
        ),
        Route(
            "DELETE",
            "/v1/tokens/{id}",
            revoke,
            "Revoke a token id and every token attenuated from it (operator); idempotent",
            response=RevocationRow,
            errors=(403, 503),
        ),
    ]

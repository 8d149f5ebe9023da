"""The token endpoints: what a token allows (any valid token), and revocation (operators).

Revocations are written by the app registry, like apps; a broker without it forwards there, and
every broker learns of a revocation from the catalog within milliseconds.
"""

from __future__ import annotations

import time

from aiohttp import web

from souk.broker.api.apps import forward_registry
from souk.broker.auth import grant_of, presented_token
from souk.broker.state import broker_of
from souk.broker.tokens import TOKEN_ID, Grant, apps_caveat, attenuate, expires_caveat
from souk.models.api import TokenInfo
from souk.models.duration import parse_duration
from souk.models.platform import CurrentToken, DeployTokenRequest, DeployTokenResponse, FlyToken
from souk.web import ApiError, read_model, reply


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
    """souk's fields, and Fly's `tokens` list: the token's id, its apps (none listed: every
    app) and their organisation when they share one."""
    grant = grant_of(request)
    info = token_info(grant)
    orgs = {row.org for row in broker_of(request).fleet.apps() if row.name in (grant.apps or ())}
    fly = FlyToken(
        token_id=grant.token_id,
        apps=info.apps,
        org_slug=orgs.pop() if len(orgs) == 1 else None,
    )
    # a dimension without limit is left out, not null (typed clients refuse nulls)
    return reply(CurrentToken(**info.model_dump(), tokens=[fly]).model_dump(exclude_none=True))


async def deploy_token(request: web.Request) -> web.Response:
    """Fly's app deploy token: the caller's own token attenuated to this one app (and to
    `expiry` from now, a duration such as "720h"). It can do no more than the caller's, and
    shares its id: revoking the caller's token revokes it too."""
    app = request.match_info["app"]
    broker_of(request).require_app(app)
    body = await read_model(request, DeployTokenRequest)
    caveats = [apps_caveat([app])]
    if body.expiry:
        try:
            seconds = parse_duration(body.expiry)
        except ValueError as exc:
            raise ApiError(400, "invalid", f"expiry: {exc}") from None
        if seconds <= 0:
            raise ApiError(400, "invalid", "expiry: a duration above zero")
        caveats.append(expires_caveat(time.time() + seconds))
    token = attenuate(presented_token(request), caveats)
    return reply(DeployTokenResponse(token=token))


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

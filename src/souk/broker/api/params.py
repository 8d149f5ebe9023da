"""Reading a request's path and query parameters, each refused with a 400 that names it."""

from __future__ import annotations

from typing import cast, get_args

from aiohttp import web

from souk.broker.placement.policies import POLICIES, Policy
from souk.models.api import NONCE_HEADER, Strategy
from souk.web import ApiError


def machine_ids(request: web.Request) -> tuple[str, str]:
    """(app, machine id) from the path."""
    return request.match_info["app"], request.match_info["id"]


def lease_nonce(request: web.Request) -> str | None:
    return request.headers.get(NONCE_HEADER) or None


def flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false").lower()
    if value not in ("1", "true", "0", "false", ""):
        raise ApiError(400, "invalid", f"{name}: true or false")
    return value in ("1", "true")


def strategy(request: web.Request) -> Strategy:
    value = request.query.get("strategy", "auto")
    if value not in get_args(Strategy):
        raise ApiError(400, "invalid", "strategy: auto, offers, p2c or catalog")
    return cast(Strategy, value)


def policy(request: web.Request) -> Policy | None:
    """The named policy, or None for the broker's own."""
    name = request.query.get("policy")
    if name is None:
        return None
    if name not in POLICIES:
        raise ApiError(400, "invalid", f"policy: one of {', '.join(POLICIES)}")
    return POLICIES[name]


def passed(request: web.Request, *names: str) -> dict[str, str]:
    """The query parameters `names` the caller sent, to be passed on to a worker as they are."""
    return {k: v for k, v in request.query.items() if k in names}

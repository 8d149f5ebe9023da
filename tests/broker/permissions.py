"""Walking a route table with tokens of every kind, and what each answer must be, worked out
from the permission each route declares (`souk.web.Permission`) and nothing else."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import aiohttp

from souk.broker.tokens import ACTIONS, attenuate, mint
from souk.web import Permission, Route

PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")
# Sent with every request: an immediate answer from a wait, and a change stream that replays
# from the start (so an allowed caller gets its headers with the first row it may see).
QUERY = {"timeout": "0", "since": "0"}
BODY_METHODS = ("POST", "PUT", "PATCH")


@dataclass(frozen=True)
class Kind:
    """A kind of token, and what it is: valid or not, an operator's or not, its caveats."""

    name: str
    token: str | None
    valid: bool = True
    operator: bool = False
    apps: frozenset[str] | None = None
    actions: frozenset[str] = ACTIONS


def token_kinds(secret: bytes, app: str, other: str) -> tuple[list[Kind], str]:
    """Every kind of token for `app`, and the one the caller must revoke before the walk."""
    revoked = mint(secret, apps=[app])
    own = frozenset({app})
    kinds = [
        Kind("no token", None, valid=False),
        Kind("a malformed token", "souk1_bm90LWEtdG9rZW4.c2ln", valid=False),
        Kind("an expired token", attenuate(mint(secret, apps=[app]), ["expires=1"]), valid=False),
        Kind("a revoked token", revoked, valid=False),
        Kind("another app's token", mint(secret, apps=[other]), apps=frozenset({other})),
        Kind(
            "a read-only token",
            mint(secret, apps=[app], read_only=True),
            apps=own,
            actions=frozenset({"read"}),
        ),
        Kind(
            "a read-write token",
            attenuate(mint(secret, apps=[app]), ["actions=read,write"]),
            apps=own,
            actions=frozenset({"read", "write"}),
        ),
        Kind("a deploy token", mint(secret, apps=[app]), apps=own),
        Kind("a token for every app", mint(secret)),
        Kind("an operator token", mint(secret, operator=True), operator=True),
    ]
    return kinds, revoked


def expected(permission: Permission | None, kind: Kind, app: str | None) -> int | None:
    """401, 403, or None for allowed (any other answer), for a request that names `app` where
    the permission says an app is named (None: it names none)."""
    if permission is not None and permission.need == "public":
        return None
    if not kind.valid:
        return 401
    if permission is None:
        return 403
    if permission.need == "token":
        return None
    if permission.action not in kind.actions:
        return 403
    if permission.need == "operator":
        return None if kind.operator and kind.apps is None else 403
    if kind.apps is None:
        return None
    if app is None:  # names no app: only a route that shows the token's own rows may answer
        return None if permission.own_rows else 403
    return None if app in kind.apps else 403


def named_app(route: Route, fill: Mapping[str, str], body: object) -> str | None:
    """The app a walked request names, where its route's permission looks for one."""
    where = route.permission.app if route.permission is not None else None
    if where is None:
        return None
    if where.where == "path":
        return fill[where.name]
    if where.where == "query":
        return QUERY.get(where.name)
    sent = body if route.method in BODY_METHODS and isinstance(body, dict) else {}
    value = sent.get(where.name)
    return value if isinstance(value, str) else None


async def status_of(
    session: aiohttp.ClientSession, method: str, url: str, token: str | None, body: object
) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    json = body if method in BODY_METHODS else None
    timeout = aiohttp.ClientTimeout(total=30)  # a bound on a stuck stream, not a measurement
    async with session.request(
        method, url, headers=headers, params=QUERY, json=json, timeout=timeout
    ) as resp:
        return resp.status


async def walk(
    base: str,
    routes: Iterable[Route],
    kinds: list[Kind],
    fill: Mapping[str, str],
    body: object = None,
) -> tuple[list[str], int]:
    """Every route with every kind of token: the answers that disagree with `expected`, and
    how many requests were made."""
    problems: list[str] = []
    made = 0
    async with aiohttp.ClientSession() as session:
        for route in routes:
            path = PARAM.sub(lambda m: fill[m.group(1)], route.path)
            for kind in kinds:
                status = await status_of(session, route.method, base + path, kind.token, body)
                made += 1
                want = expected(route.permission, kind, named_app(route, fill, body))
                if status in (401, 403) if want is None else status != want:
                    needs = route.permission.describe() if route.permission else "undeclared"
                    problems.append(
                        f"{route.method} {route.path} ({needs}) with {kind.name}: {status},"
                        f" expected {want or 'anything but 401 and 403'}"
                    )
    return problems, made

"""Registry authentication: the `WWW-Authenticate` challenge a registry answers 401 with, and the
token request of the Bearer flow (anonymous, or with basic-auth credentials from config)."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

PARAM = re.compile(r'(\w+)\s*=\s*(?:"([^"]*)"|([^\s,]+))')


class AuthError(Exception):
    """The registry refused us, or its token server did."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def basic(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "bearer" or "basic", lower-cased
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge:
    scheme, _, rest = header.strip().partition(" ")
    params = {m[1].lower(): m[2] if m[2] is not None else m[3] for m in PARAM.finditer(rest)}
    return Challenge(scheme.lower(), params)


@dataclass
class Token:
    value: str
    expires: float  # time.monotonic()


async def fetch_token(
    session: aiohttp.ClientSession,
    challenge: Challenge,
    scope: str,
    credentials: Credentials | None,
    allow_http: bool,
    check: Callable[[str], None] = lambda _url: None,
) -> Token:
    """Ask the challenge's realm for a token for `scope`. `check`: raises for a realm the
    worker does not connect to (`egress.Egress.check`); a realm's redirect is not followed."""
    realm = challenge.params.get("realm")
    if not realm:
        raise AuthError("Bearer challenge without a realm")
    if not realm.startswith(("https://", "http://")):
        raise AuthError("token realm is not an http(s) URL")
    if realm.startswith("http://") and not allow_http:
        raise AuthError(f"token realm {realm} is plain http and the registry is not insecure")
    check(realm)
    query = {"scope": scope}
    if "service" in challenge.params:
        query["service"] = challenge.params["service"]
    headers = {"Authorization": credentials.basic()} if credentials else {}
    async with session.get(realm, params=query, headers=headers, allow_redirects=False) as resp:
        if resp.status != 200:
            raise AuthError(f"token server {realm} answered {resp.status}")
        body = await resp.json(content_type=None)
    value = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
    if not isinstance(value, str) or not value:
        raise AuthError(f"token server {realm} sent no token")
    lifetime = body.get("expires_in") or 60
    lifetime = lifetime if isinstance(lifetime, int | float) else 60
    return Token(value, time.monotonic() + max(10.0, float(lifetime) - 10.0))

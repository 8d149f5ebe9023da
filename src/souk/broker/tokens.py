"""Bearer tokens any broker can verify alone: HMAC chains in the style of macaroons.

A token is an identifier signed with the cluster secret, followed by caveats, each folded into
the signature: `sig_0 = HMAC(secret, identifier)`, `sig_i = HMAC(sig_{i-1}, caveat_i)`. Because
each caveat is chained on the previous signature, anyone holding a token can *add* a caveat
(attenuate it, e.g. hand a CI job a read-only copy for one app) without the secret, but nobody
can remove one. Verification recomputes the chain from the secret, so there is no token database
to share between brokers and no call on the request path.

The identifier carries what a caveat cannot grant: whether the token is an operator's (fleet
operations such as cordoning a worker). Caveats only restrict:

- `apps=a,b`      only these apps (several such caveats intersect)
- `access=read`   only reads (GET)
- `expires=T`     not valid at or after unix time T

An unknown caveat makes a token invalid: a restriction a broker does not understand must not be
ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "souk1_"
MAX_TOKEN_CHARS = 8192
MIN_SECRET_BYTES = 16


class TokenError(Exception):
    """The token is malformed, forged, or no longer valid; the message says which."""


@dataclass(frozen=True)
class Grant:
    """What a verified token allows."""

    token_id: str
    operator: bool
    apps: frozenset[str] | None  # None: every app
    read_only: bool
    expires: int | None

    def allows(self, app: str | None, write: bool) -> bool:
        if write and self.read_only:
            return False
        return app is None or self.apps is None or app in self.apps

    def why_not(self, app: str | None, write: bool) -> str:
        if write and self.read_only:
            return "this token is read-only"
        if app is not None and self.apps is not None and app not in self.apps:
            return f"this token is not valid for app {app!r}"
        return ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _chain(secret: bytes, identifier: str, caveats: list[str]) -> bytes:
    sig = hmac.new(secret, identifier.encode(), hashlib.sha256).digest()
    for caveat in caveats:
        sig = hmac.new(sig, caveat.encode(), hashlib.sha256).digest()
    return sig


def _encode(identifier: str, caveats: list[str], sig: bytes) -> str:
    body = json.dumps({"i": identifier, "c": caveats}, separators=(",", ":")).encode()
    return f"{PREFIX}{_b64(body)}.{_b64(sig)}"


def _decode(token: str) -> tuple[str, list[str], bytes]:
    if len(token) > MAX_TOKEN_CHARS:
        raise TokenError("token too long")
    if not token.startswith(PREFIX) or token.count(".") != 1:
        raise TokenError("not a souk token")
    body_text, sig_text = token[len(PREFIX) :].split(".")
    try:
        body = json.loads(_unb64(body_text))
        sig = _unb64(sig_text)
    except (ValueError, binascii.Error) as exc:
        raise TokenError("token is not well-formed") from exc
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("i"), str)
        or not isinstance(body.get("c"), list)
        or not all(isinstance(c, str) for c in body["c"])
    ):
        raise TokenError("token is not well-formed")
    return body["i"], body["c"], sig


def mint(
    secret: bytes,
    *,
    apps: list[str] | None = None,
    read_only: bool = False,
    operator: bool = False,
    ttl: float | None = None,
    now: float | None = None,
) -> str:
    """A new token signed with the cluster secret."""
    check_secret(secret)
    identifier = json.dumps(
        {"v": 1, "id": secrets.token_hex(8), "op": operator}, separators=(",", ":")
    )
    token = _encode(identifier, [], _chain(secret, identifier, []))
    caveats: list[str] = []
    if apps is not None:
        caveats.append("apps=" + ",".join(sorted(set(apps))))
    if read_only:
        caveats.append("access=read")
    if ttl is not None:
        caveats.append(f"expires={int((time.time() if now is None else now) + ttl)}")
    return attenuate(token, caveats)


def attenuate(token: str, caveats: list[str]) -> str:
    """The same token with more restrictions; needs no secret, cannot widen anything."""
    identifier, existing, sig = _decode(token)
    for caveat in caveats:
        _parse_caveat(caveat)  # refuse to add one nobody could verify
        sig = hmac.new(sig, caveat.encode(), hashlib.sha256).digest()
    return _encode(identifier, [*existing, *caveats], sig)


def verify(token: str, secret: bytes, now: float | None = None) -> Grant:
    """Check the signature chain and every caveat's validity; return what the token allows."""
    identifier, caveats, sig = _decode(token)
    if not hmac.compare_digest(sig, _chain(secret, identifier, caveats)):
        raise TokenError("token signature does not verify")
    try:
        ident = json.loads(identifier)
        token_id, operator = str(ident["id"]), ident["op"] is True
    except (ValueError, KeyError, TypeError) as exc:
        raise TokenError("token identifier is not well-formed") from exc
    apps: frozenset[str] | None = None
    read_only = False
    expires: int | None = None
    for caveat in caveats:
        key, value = _parse_caveat(caveat)
        if key == "apps":
            named = frozenset(a for a in value.split(",") if a)
            apps = named if apps is None else apps & named
        elif key == "access":
            read_only = True
        else:
            expires = int(value) if expires is None else min(expires, int(value))
    if expires is not None and (time.time() if now is None else now) >= expires:
        raise TokenError("token has expired")
    return Grant(token_id, operator, apps, read_only, expires)


def _parse_caveat(caveat: str) -> tuple[str, str]:
    key, sep, value = caveat.partition("=")
    if sep and key == "apps":
        return key, value
    if sep and key == "access" and value == "read":
        return key, value
    if sep and key == "expires" and value.isdigit():
        return key, value
    raise TokenError(f"unknown caveat {caveat!r}")


def check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the cluster secret must be at least {MIN_SECRET_BYTES} bytes")


def new_secret() -> bytes:
    """A fresh cluster secret, printable so it can live in a file or an environment variable."""
    return secrets.token_hex(32).encode()


def read_secret(path: Path) -> bytes:
    secret = path.read_bytes().strip()
    check_secret(secret)
    return secret

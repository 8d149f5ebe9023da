"""Bearer tokens any broker can verify alone: HMAC-chained caveats, in the style of macaroons.

A token is an identifier signed with the cluster secret, followed by caveats, each folded into
the signature: `sig_0 = HMAC(secret, identifier)`, `sig_i = HMAC(sig_{i-1}, caveat_i)`. Because
each caveat is chained on the previous signature, anyone holding a token can *add* a caveat
(attenuate it, e.g. hand a CI job a read-only copy for one app) without the secret, but nobody
can remove one. Verification recomputes the chain from the secret, so there is no token database
to share between brokers; the only shared state is the (small, replicated) list of revoked ids.

The identifier carries what no caveat can grant: the token's id (what `revoke` names; every
attenuated copy shares it) and whether it is an operator's (fleet operations). Caveats only
restrict; a request must satisfy every one of them (see `Grant.denial`):

- `apps=a,b`          only these apps
- `actions=read,write` only these kinds of request: read, write (operate machines), deploy
  (create, update or destroy apps and machines); `access=read` is an older spelling of
  `actions=read`
- `machines=id,...`   only requests about these machines
- `regions=mad,...`   only requests about machines in these regions
- `expires=T`         not valid at or after unix time T

Caveats are parsed strictly and with bounds: an unknown or malformed one makes the whole token
invalid (a restriction a broker does not understand must not be ignored), and no caveat, however
long or odd, can cost more than a few microseconds to check.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, get_args

import orjson

from souk.models.api import REGION_NAME
from souk.models.base import APP_NAME
from souk.models.machine import MACHINE_ID
from souk.node.cluster_secret import check_secret

PREFIX = "souk1_"
MAX_TOKEN_CHARS = 8192
MAX_CAVEATS = 32
MAX_CAVEAT_CHARS = 2048
MAX_VALUES = 64  # names in one list caveat
MAX_EXPIRES_DIGITS = 12  # unix seconds up to the year 33658
SIG_BYTES = 32
VERIFIED_KEPT = 1024  # tokens whose signature is known good: 8 MiB at most

Action = Literal["read", "write", "deploy"]
ACTIONS: frozenset[str] = frozenset(get_args(Action))
# Matched with fullmatch only: `$` would let a trailing newline through.
TOKEN_ID = re.compile(r"[0-9a-f]{16}")
_B64 = re.compile(r"[A-Za-z0-9_-]*")
_FROM_URLSAFE = str.maketrans("-_", "+/")
_EXPIRES = re.compile(rf"0|[1-9][0-9]{{0,{MAX_EXPIRES_DIGITS - 1}}}")
_CAVEAT = re.compile(r"[a-z]{1,16}=[!-~]*")  # printable ASCII, no spaces
_NAMES = {"apps": APP_NAME, "machines": MACHINE_ID, "regions": REGION_NAME}


class TokenError(Exception):
    """The token is malformed, forged, expired, revoked or carries a caveat nobody can check.
    `reason` is machine-readable (it becomes the 401's `status`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Scope:
    """What one request touches, as the auth middleware works it out.

    `app`, `machine` and `region` are None when the request names none; a caveat on that
    dimension then refuses it, except an `apps` caveat on `lists_apps` requests (routes whose
    handlers show only the rows of the token's apps, such as GET /v1/apps). `fleet` requests
    (workers, the catalog's own state, revocations) belong to no app.
    """

    action: Action
    app: str | None = None
    machine: str | None = None
    region: str | None = None
    fleet: bool = False
    lists_apps: bool = False


@dataclass(frozen=True)
class Grant:
    """What a verified token allows: each field the intersection of its caveats."""

    token_id: str
    operator: bool
    apps: frozenset[str] | None = None  # None: every app
    actions: frozenset[str] = ACTIONS
    machines: frozenset[str] | None = None
    regions: frozenset[str] | None = None
    expires: int | None = None

    @property
    def read_only(self) -> bool:
        return self.actions <= {"read"}

    def denial(self, scope: Scope) -> str | None:
        """Why the token does not allow the request, or None if it does."""
        if scope.fleet and not self.operator:
            return "fleet operations need an operator token"
        if scope.action not in self.actions:
            if self.read_only:
                return f"this token is read-only; this request is a {scope.action}"
            allowed = ", ".join(sorted(self.actions)) or "nothing"
            return f"this token allows {allowed}, not {scope.action}"
        if self.apps is not None:
            if scope.fleet:
                return "this token is limited to some apps; fleet operations span them all"
            if scope.app is None and not scope.lists_apps:
                return "this token is limited to some apps, and this request names none"
            if scope.app is not None and scope.app not in self.apps:
                return f"this token is not valid for app {scope.app!r}"
        if self.machines is not None and scope.machine not in self.machines:
            if scope.machine is None:
                return "this token is limited to some machines, and this request names none"
            return f"this token is not valid for machine {scope.machine!r}"
        if self.regions is not None and scope.region not in self.regions:
            if scope.region is None:
                return "this token is limited to some regions, and this request names none"
            return f"this token is not valid in region {scope.region!r}"
        return None

    def permits(self, scope: Scope) -> bool:
        return self.denial(scope) is None

    def sees(self, app: str, machine: str | None, region: str | None) -> bool:
        """Whether a row of this app (and machine, in this region) may be shown: what routes
        that answer with only the caller's rows filter by."""
        return self.permits(Scope("read", app=app, machine=machine, region=region))

    def sees_fleet(self) -> bool:
        """Whether rows of no app (workers, images, revocations) may be shown."""
        return self.permits(Scope("read", fleet=True))


# --- caveats ------------------------------------------------------------------------------


def apps_caveat(names: Iterable[str]) -> str:
    return "apps=" + ",".join(sorted(set(names)))


def actions_caveat(actions: Iterable[str]) -> str:
    return "actions=" + ",".join(sorted(set(actions)))


def machines_caveat(ids: Iterable[str]) -> str:
    return "machines=" + ",".join(sorted(set(ids)))


def regions_caveat(names: Iterable[str]) -> str:
    return "regions=" + ",".join(sorted(set(names)))


def expires_caveat(unix_time: float) -> str:
    return f"expires={int(unix_time)}"


def parse_caveat(caveat: object) -> tuple[str, frozenset[str] | int]:
    """(kind, the set it allows or the expiry time); TokenError for anything else."""
    if not isinstance(caveat, str):
        raise TokenError("caveat_malformed", "a caveat is a string")
    if len(caveat) > MAX_CAVEAT_CHARS:
        raise TokenError("caveat_malformed", f"a caveat is at most {MAX_CAVEAT_CHARS} characters")
    if not _CAVEAT.fullmatch(caveat):
        raise TokenError("caveat_malformed", f"caveat {caveat[:64]!r} is not key=value")
    key, _, value = caveat.partition("=")
    if key == "expires":
        if not _EXPIRES.fullmatch(value):
            raise TokenError(
                "caveat_malformed",
                f"expires: unix seconds, at most {MAX_EXPIRES_DIGITS} ASCII digits",
            )
        return key, int(value)
    if key == "access":  # the first spelling of a read-only token
        if value != "read":
            raise TokenError("caveat_malformed", "access: only 'read'")
        return "actions", frozenset({"read"})
    if key == "actions":
        named = _names(key, value)
        unknown = named - ACTIONS
        if unknown:
            raise TokenError(
                "caveat_malformed", f"actions: {sorted(unknown)[0]!r} is not read, write or deploy"
            )
        return key, named
    pattern = _NAMES.get(key)
    if pattern is None:
        raise TokenError("caveat_unknown", f"unknown caveat {key!r}")
    named = _names(key, value)
    for name in named:
        if not pattern.fullmatch(name):
            raise TokenError("caveat_malformed", f"{key}: {name[:64]!r} is not a valid name")
    return key, named


def _names(key: str, value: str) -> frozenset[str]:
    items = value.split(",")
    if len(items) > MAX_VALUES:
        raise TokenError("caveat_malformed", f"{key}: at most {MAX_VALUES} names")
    if "" in items:
        raise TokenError("caveat_malformed", f"{key}: a comma-separated list of names, none empty")
    return frozenset(items)


# --- the wire form ------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not _B64.fullmatch(text):
        raise TokenError("token_malformed", "token is not well-formed")
    try:  # `urlsafe_b64decode` without its Python layers: the alphabet was checked above
        return binascii.a2b_base64((text + "=" * (-len(text) % 4)).translate(_FROM_URLSAFE))
    except (ValueError, binascii.Error) as exc:
        raise TokenError("token_malformed", "token is not well-formed") from exc


def _link(key: bytes, text: str) -> bytes:
    """One link of the chain. `hmac.digest` is one call into OpenSSL; `hmac.new` runs Python."""
    return hmac.digest(key, text.encode(), "sha256")


def _chain(secret: bytes, identifier: str, caveats: list[str]) -> bytes:
    sig = _link(secret, identifier)
    for caveat in caveats:
        sig = _link(sig, caveat)
    return sig


def _encode(identifier: str, caveats: list[str], sig: bytes) -> str:
    body = orjson.dumps({"i": identifier, "c": caveats})
    return f"{PREFIX}{_b64(body)}.{_b64(sig)}"


def _decode(token: str) -> tuple[str, list[str], bytes]:
    """The token's parts, checked for shape and bounds only (not yet the signature)."""
    if len(token) > MAX_TOKEN_CHARS:
        raise TokenError("token_malformed", f"a token is at most {MAX_TOKEN_CHARS} characters")
    if not token.startswith(PREFIX) or token.count(".") != 1:
        raise TokenError("token_malformed", "not a souk token")
    body_text, sig_text = token[len(PREFIX) :].split(".")
    sig = _unb64(sig_text)
    try:
        body = orjson.loads(_unb64(body_text))  # C, with a fixed depth limit: never recurses
    except orjson.JSONDecodeError as exc:
        raise TokenError("token_malformed", "token is not well-formed") from exc
    if (
        len(sig) != SIG_BYTES
        or not isinstance(body, dict)
        or body.keys() != {"i", "c"}
        or not isinstance(body["i"], str)
        or not isinstance(body["c"], list)
    ):
        raise TokenError("token_malformed", "token is not well-formed")
    caveats: list[str] = body["c"]
    if len(caveats) > MAX_CAVEATS:
        raise TokenError("token_malformed", f"a token carries at most {MAX_CAVEATS} caveats")
    if not all(isinstance(c, str) for c in caveats):
        raise TokenError("caveat_malformed", "a caveat is a string")
    return body["i"], caveats, sig


def _identity(identifier: str) -> tuple[str, bool]:
    try:
        ident = orjson.loads(identifier)
    except orjson.JSONDecodeError:
        ident = None
    if (
        not isinstance(ident, dict)
        or ident.keys() != {"v", "id", "op"}
        or type(ident["v"]) is not int
        or ident["v"] != 1
        or not isinstance(ident["id"], str)
        or not TOKEN_ID.fullmatch(ident["id"])
        or not isinstance(ident["op"], bool)
    ):
        raise TokenError("token_malformed", "token identifier is not well-formed")
    return ident["id"], ident["op"]


# --- minting, attenuating, verifying -------------------------------------------------------


def mint(
    secret: bytes,
    *,
    apps: Iterable[str] | None = None,
    read_only: bool = False,
    operator: bool = False,
    ttl: float | None = None,
    now: float | None = None,
    caveats: Iterable[str] = (),
) -> str:
    """A new token signed with the cluster secret, with a fresh id."""
    check_secret(secret)
    identifier = orjson.dumps({"v": 1, "id": secrets.token_hex(8), "op": operator}).decode()
    token = _encode(identifier, [], _chain(secret, identifier, []))
    more: list[str] = []
    if apps is not None:
        more.append(apps_caveat(apps))
    if read_only:
        more.append(actions_caveat(["read"]))
    if ttl is not None:
        more.append(expires_caveat((time.time() if now is None else now) + ttl))
    return attenuate(token, [*more, *caveats])


def attenuate(token: str, caveats: Iterable[str]) -> str:
    """The same token with more restrictions; needs no secret, cannot widen anything."""
    identifier, existing, sig = _decode(token)
    added = list(caveats)
    for caveat in added:
        parse_caveat(caveat)  # refuse to add one no broker could verify
        sig = _link(sig, caveat)
    out = _encode(identifier, [*existing, *added], sig)
    _decode(out)  # over the bounds: refused now, not at its first use
    return out


def inspect(token: str) -> tuple[str, bool, list[str]]:
    """(id, operator, caveats) as the token states them, unverified: for showing, not trusting."""
    identifier, caveats, _ = _decode(token)
    token_id, operator = _identity(identifier)
    return token_id, operator, caveats


def verify(
    token: str,
    secret: bytes,
    now: float | None = None,
    revoked: Callable[[str], bool] | None = None,
) -> Grant:
    """Check the signature chain, every caveat and revocation; return what the token allows.
    Revocation and expiry are checked at every call; the rest is the same for the same token
    and secret, so a client's every request after its first skips the chain (`_signed`)."""
    grant = _signed(token, secret)
    if revoked is not None and revoked(grant.token_id):
        raise TokenError("token_revoked", f"token {grant.token_id} has been revoked")
    if grant.expires is not None and (time.time() if now is None else now) >= grant.expires:
        raise TokenError("token_expired", "token has expired")
    return grant


@functools.lru_cache(maxsize=VERIFIED_KEPT)
def _signed(token: str, secret: bytes) -> Grant:
    """What a token's signature and caveats allow, before revocation and expiry. Kept for the
    tokens last seen: only tokens that verify (an error is not kept), each at most
    `MAX_TOKEN_CHARS`, keyed by the secret too."""
    identifier, caveats, sig = _decode(token)
    if not hmac.compare_digest(sig, _chain(secret, identifier, caveats)):
        raise TokenError("bad_signature", "token signature does not verify")
    token_id, operator = _identity(identifier)
    sets: dict[str, frozenset[str]] = {}
    expires: int | None = None
    for caveat in caveats:
        key, value = parse_caveat(caveat)
        if isinstance(value, int):
            expires = value if expires is None else min(expires, value)
        else:
            sets[key] = value if key not in sets else sets[key] & value
    return Grant(
        token_id,
        operator,
        apps=sets.get("apps"),
        actions=sets.get("actions", ACTIONS),
        machines=sets.get("machines"),
        regions=sets.get("regions"),
        expires=expires,
    )

"""Which roles may call which HTTP route, declared as one table and enforced by a middleware,
from the client certificate the TLS handshake verified."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from aiohttp import web
from aiohttp.typedefs import Middleware
from cryptography import x509

from souk.pki.identity import ROLES, Identity, PkiError, identity_of
from souk.web.errors import Handler, json_error

ANYONE = "anyone"  # as a rule's role: the route needs no certificate at all
_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


def peer_identity(request: web.Request) -> Identity | None:
    """The identity in the client certificate of this request's connection, or None if it
    showed none (or came without TLS). Raises PkiError if it showed one that is no souk identity."""
    transport = request.transport
    if transport is None:
        return None
    conn = transport.get_extra_info("ssl_object")
    if conn is None:
        return None
    if conn.context.verify_mode == ssl.CERT_NONE:
        # Python hands over an unverified certificate just the same; it proves nothing.
        raise RuntimeError("the server's TLS context does not verify client certificates")
    der = conn.getpeercert(binary_form=True)
    if der is None:
        return None
    return _identity(der)


@functools.lru_cache(maxsize=4096)
def _identity(der: bytes) -> Identity:
    """Parsed once per certificate, not per request (about 40 µs each): the handshake has
    verified it already, and what is read from it does not change; its expiry is checked by
    the caller on every request. A certificate that is no souk identity raises, uncached."""
    return identity_of(x509.load_der_x509_certificate(der))


@dataclass(frozen=True)
class AccessTable:
    """`rules` maps "METHOD /path/{var}" (as the route was added) to the roles allowed to call
    it, or to {ANYONE}. A route missing from the table is allowed to nobody."""

    rules: Mapping[str, Collection[str]]

    def __post_init__(self) -> None:
        for key, roles in self.rules.items():
            method, _, path = key.partition(" ")
            if method not in _METHODS or not path.startswith("/"):
                raise ValueError(f"bad rule {key!r}: write it as 'METHOD /path'")
            unknown = set(roles) - {*ROLES, ANYONE}
            if unknown:
                raise ValueError(f"rule {key!r} names unknown roles {sorted(unknown)}")
            if ANYONE in roles and len(set(roles)) > 1:
                raise ValueError(f"rule {key!r}: {ANYONE!r} stands alone")

    def allowed(self, method: str, path: str) -> frozenset[str]:
        roles = self.rules.get(f"{method} {path}")
        if roles is None and method == "HEAD":
            roles = self.rules.get(f"GET {path}")
        return frozenset(roles or ())

    def unruled(self, app: web.Application) -> list[str]:
        """The app's routes the table says nothing of: each is closed to every role."""
        missing = []
        for route in app.router.routes():
            if route.resource is None or route.method == "HEAD":
                continue
            key = f"{route.method} {route.resource.canonical}"
            if key not in self.rules:
                missing.append(key)
        return missing


def _deny(status: int, message: str, **details: object) -> web.Response:
    reason = "unauthorized" if status == 401 else "forbidden"
    return json_error(status, reason, message, dict(details) or None)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def role_middleware(table: AccessTable, clock: Callable[[], datetime] = _utcnow) -> Middleware:
    """401 without a valid client certificate, 403 for a role the route does not allow. A path
    that matches no route is answered by the router (404/405), but only to a known peer. A
    certificate that expires while its connection is kept alive stops working then."""

    @web.middleware
    async def check_role(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        method = request.method
        roles = table.allowed(method, resource.canonical) if resource is not None else frozenset()
        if ANYONE in roles:
            return await handler(request)
        try:
            peer = peer_identity(request)
        except PkiError as exc:
            return _deny(401, f"the client certificate is not a souk identity: {exc}")
        if peer is None:
            return _deny(401, "this route needs a client certificate from the cluster CA")
        if peer.not_after < clock():
            when = f"{peer.not_after:%Y-%m-%d %H:%M} UTC"
            return _deny(401, f"the client certificate expired on {when}")
        if resource is None:
            return await handler(request)
        if peer.role not in roles:
            return _deny(
                403,
                f"a {peer.role} may not call {method} {resource.canonical}",
                role=peer.role,
                allowed=sorted(roles),
            )
        return await handler(request)

    return check_role

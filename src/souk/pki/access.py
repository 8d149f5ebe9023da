"""Which roles may call an HTTP route, declared on the route itself (`souk.web.Route.roles`)
and enforced by a middleware, from the client certificate the TLS handshake verified."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable
from datetime import UTC, datetime

from aiohttp import web
from aiohttp.typedefs import Middleware
from cryptography import x509

from souk.pki.identity import ROLES, Identity, PkiError, identity_of
from souk.web.errors import Handler, json_error
from souk.web.routes import declared_route

ANYONE = "anyone"  # as a rule's role: the route needs no certificate at all


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
    """Parsed once per certificate, not per request, as parsing costs far more than the rest
    of a request's check (docs/benchmarks.md, "A certificate's identity, parsed once"): the
    handshake has verified it already, and what is read from it does not change; its expiry is
    checked by the caller on every request. A certificate that is no souk identity raises,
    uncached."""
    return identity_of(x509.load_der_x509_certificate(der))


def mtls_roles(*roles: str) -> frozenset[str]:
    """The roles a route's `roles` names, checked: known roles, or ANYONE alone (the route
    needs no certificate at all)."""
    unknown = set(roles) - {*ROLES, ANYONE}
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}")
    if ANYONE in roles and len(set(roles)) > 1:
        raise ValueError(f"{ANYONE!r} stands alone")
    return frozenset(roles)


def _deny(status: int, message: str, **details: object) -> web.Response:
    reason = "unauthorized" if status == 401 else "forbidden"
    return json_error(status, reason, message, dict(details) or None)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def role_middleware(clock: Callable[[], datetime] = _utcnow) -> Middleware:
    """401 without a valid client certificate, 403 for a role the matched route's `roles` does
    not name; a route served but not declared (`souk.web.add_routes`) is closed to every role.
    A path that matches no route is answered by the router (404/405), but only to a known peer.
    A certificate that expires while its connection is kept alive stops working then."""

    @web.middleware
    async def check_role(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        method = request.method
        route = declared_route(request) if resource is not None else None
        roles = route.roles if route is not None else frozenset()
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

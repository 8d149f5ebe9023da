"""Role checks on a small aiohttp app behind real mutual TLS on loopback: every caller against
every route of its route table, each answer as the routes' roles say."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.x509.oid import NameOID

from souk.models.errors import ErrorBody
from souk.pki import (
    ANYONE,
    ROLES,
    client_context,
    load_cert,
    load_key,
    mtls_roles,
    peer_identity,
    role_middleware,
    save_cert,
    server_context,
)
from souk.web import Route, add_routes, error_middleware, undeclared
from tests.support.pki import LOOPBACK, Pki, forged, serving

RULES: dict[str, set[str]] = {
    "GET /v1/capacity": {"broker", "operator"},
    "POST /v1/machines": {"broker", "operator"},
    "GET /v1/machines/{id}": {"broker", "proxy", "operator"},
    "POST /v1/machines/{id}/start": {"broker", "proxy", "operator"},
    "DELETE /v1/machines/{id}": {"broker", "operator"},
    "POST /v1/cordon": {"operator"},
    "GET /healthz": {ANYONE},
}
UNRULED = "GET /v1/unruled"  # served, but the table says nothing of it: closed to every role
NAMED_NONE = "GET /v1/nobody"  # declared, naming no role: closed to every role too


async def echo(request: web.Request) -> web.Response:
    peer = peer_identity(request)
    resource = request.match_info.route.resource
    assert resource is not None
    return web.json_response({"route": resource.canonical, "peer": peer.uri if peer else None})


def make_app(**middleware: Any) -> web.Application:
    app = web.Application(middlewares=[error_middleware, role_middleware(**middleware)])
    routes = []
    for key in [*RULES, NAMED_NONE]:
        method, path = key.split(" ")
        routes.append(Route(method, path, echo, key, roles=mtls_roles(*RULES.get(key, ()))))
    add_routes(app, routes, "test", "0")
    for route in routes:
        if route.method == "GET":  # a HEAD is checked as its GET
            app.router.add_route("HEAD", route.path, echo)
    app.router.add_get(UNRULED.split(" ")[1], echo)  # and HEAD
    return app


def url(port: int, path: str, scheme: str = "https") -> str:
    return f"{scheme}://{LOOPBACK}:{port}{path.replace('{id}', 'm1')}"


async def ask(
    port: int, key: str, ctx: ssl.SSLContext | None, scheme: str = "https"
) -> tuple[int, Any]:
    """(status, JSON body) on a new connection; ('refused', why) if TLS turned it away."""
    method, path = key.split(" ")
    kwargs: dict[str, Any] = {"ssl": ctx, "server_hostname": "w1"} if ctx is not None else {}
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, url(port, path, scheme), **kwargs) as resp,
        ):
            return resp.status, await resp.json() if method != "HEAD" else None
    except aiohttp.ClientConnectionError as exc:
        return "refused", str(exc)  # type: ignore[return-value]


@pytest.fixture
async def server(pki: Pki) -> AsyncIterator[int]:
    """Clients may come without a certificate here, so that the middleware can answer 401."""
    ctx = server_context(pki.node("worker", "w1"), require_client_cert=False)
    async with serving(make_app(), ctx) as port:
        yield port


def callers(pki: Pki, other_pki: Pki) -> dict[str, ssl.SSLContext]:
    trusting = pki.ca_dir / "ca.crt"
    no_cert = ssl.create_default_context(cafile=trusting)
    stranger = replace(other_pki.node("operator", "ops"), ca=trusting)
    contexts = {
        "no certificate": no_cert,
        "other CA": client_context(stranger),
        "expired": client_context(pki.node("operator", "old-ops", age_days=40)),
    }
    for role in ROLES:
        contexts[role] = client_context(pki.node(role, f"{role}-1"))
    return contexts


def expected(caller: str, key: str) -> int | str:
    roles = RULES.get(key)
    if caller in ("other CA", "expired"):
        return "refused"  # the handshake turns away a certificate it cannot verify
    if roles is not None and ANYONE in roles:
        return 200
    if caller == "no certificate":
        return 401
    if roles is None or caller not in roles:
        return 403
    return 200


async def test_every_caller_on_every_route(pki: Pki, other_pki: Pki, server: int):
    seen: dict[str, int | str] = {}
    for caller, ctx in callers(pki, other_pki).items():
        for key in [*RULES, UNRULED, NAMED_NONE]:
            status, body = await ask(server, key, ctx)
            want = expected(caller, key)
            assert status == want, f"{caller} on {key}: {status} {body}"
            seen[f"{caller} {key}"] = status
            if status == 200:
                assert body["route"] == key.split(" ")[1]
                assert body["peer"] == (
                    None if caller == "no certificate" else f"souk://{caller}/{caller}-1"
                )
            elif status in (401, 403):
                error = ErrorBody.model_validate(body)
                assert (
                    error.status == error.code == ("unauthorized" if status == 401 else "forbidden")
                )
                if status == 403:
                    assert error.details == {
                        "role": caller,
                        "allowed": sorted(RULES.get(key, ())),
                    }
                    assert caller in error.error and key.split(" ")[1] in error.error
    # The walk met every kind of answer, so the table and the expectations are not both vacuous.
    assert set(seen.values()) == {200, 401, 403, "refused"}


async def test_head_follows_get_and_unknown_paths_need_a_peer(pki: Pki, server: int):
    broker = client_context(pki.node("broker", "b1"))
    worker = client_context(pki.node("worker", "w2"))
    assert (await ask(server, "HEAD /v1/capacity", broker))[0] == 200
    assert (await ask(server, "HEAD /v1/capacity", worker))[0] == 403
    assert (await ask(server, "GET /v1/nowhere", broker))[0] == 404
    assert (await ask(server, "PUT /v1/capacity", broker))[0] == 405
    no_cert = ssl.create_default_context(cafile=pki.ca_dir / "ca.crt")
    assert (await ask(server, "GET /v1/nowhere", no_cert))[0] == 401


async def test_plain_http_has_no_peer(pki: Pki):
    async with serving(make_app(), None) as port:
        status, body = await ask(port, "GET /v1/capacity", None, scheme="http")
        assert (status, body["status"]) == (401, "unauthorized")
        assert (await ask(port, "GET /healthz", None, scheme="http"))[0] == 200


async def test_a_certificate_that_expires_on_a_kept_alive_connection_stops_working(pki: Pki):
    """The handshake checked the dates once; the middleware checks them on every request."""
    broker = client_context(pki.node("broker", "b1"))
    later = datetime.now(UTC) + timedelta(days=31)
    ctx = server_context(pki.node("worker", "w1"))
    async with serving(make_app(clock=lambda: later), ctx) as port:
        status, body = await ask(port, "GET /v1/capacity", broker)
        assert status == 401
        assert "expired" in body["error"]


async def test_a_cluster_certificate_that_is_no_identity_gets_401(pki: Pki):
    ca_key, ca_cert = load_key(pki.ca_dir / "ca.key"), load_cert(pki.ca_dir / "ca.crt")
    files = pki.node("broker", "b1")
    key = load_key(files.key)
    odd = forged(
        ca_key,
        ca_cert,
        [(NameOID.ORGANIZATION_NAME, "souk"), (NameOID.COMMON_NAME, "b1")],  # no role
        None,
        key=key.public_key(),
    )
    save_cert(files.cert, odd)
    ctx = server_context(pki.node("worker", "w1"))
    async with serving(make_app(), ctx) as port:
        status, body = await ask(port, "GET /v1/capacity", client_context(files))
        assert status == 401
        assert "not a souk identity" in body["error"]


async def test_a_server_that_verifies_nothing_proves_nothing(pki: Pki):
    """Python hands over an unverified client certificate too: without verification the
    middleware fails closed instead of trusting it."""
    ctx = server_context(pki.node("worker", "w1"))
    ctx.verify_mode = ssl.CERT_NONE
    async with serving(make_app(), ctx) as port:
        status, body = await ask(port, "GET /v1/capacity", client_context(pki.node("broker", "b")))
        assert (status, body["status"]) == (500, "internal_error")


def test_the_routes_not_declared_are_named():
    assert undeclared(make_app()) == [UNRULED]


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        (("admin",), "unknown roles"),
        ((ANYONE, "broker"), "stands alone"),
    ],
)
def test_bad_roles_are_refused(roles: tuple[str, ...], message: str):
    with pytest.raises(ValueError, match=message):
        mtls_roles(*roles)

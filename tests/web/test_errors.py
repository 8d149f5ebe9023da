"""Every error, from the HTTP parser up, in the JSON error shape, on real servers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from urllib.parse import quote

import pytest

from souk.broker.api.routes import ROUTES as BROKER_ROUTES
from souk.catalog.bus import InProcessBus
from souk.catalog.replica import following
from souk.cli.catalog import catalog_site
from souk.proxy.server import ProxySettings, proxy_site
from souk.worker import http as worker_http
from tests.support.catalog_view import FakeView
from tests.web.conftest import Servers, raw, request_bytes

DEEP = b"[" * 100_000


@pytest.mark.parametrize("side", ["worker", "broker"])
async def test_oversized_headers_are_a_json_431_that_echoes_nothing(
    servers: Servers, side: str
) -> None:
    url = getattr(servers, side)
    secretish = "Bearer " + "q" * 9000
    got = await raw(url, request_bytes("GET", "/v1/machines", headers={"Authorization": secretish}))
    assert (got.status, got.reason) == (431, "headers_too_large")
    assert "qqqq" not in str(got.body)
    many = {f"X-Filler-{i}": "1" for i in range(200)}
    got = await raw(url, request_bytes("GET", "/v1/machines", headers=many))
    assert (got.status, got.reason) == (431, "headers_too_large")
    got = await raw(url, request_bytes("GET", "/" + "p" * 9000))
    assert got.status == 431 and "pppp" not in str(got.body)


@pytest.mark.parametrize("side", ["worker", "broker"])
@pytest.mark.parametrize(
    "request_line",
    [
        b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
async def test_malformed_requests_are_a_json_400(
    servers: Servers, side: str, request_line: bytes
) -> None:
    got = await raw(getattr(servers, side), request_line)
    assert (got.status, got.reason) == (400, "bad_request")
    assert got.body["code"] == "bad_request" and got.body["error"]


async def test_405_names_the_allowed_methods(servers: Servers) -> None:
    got = await raw(servers.worker, request_bytes("PATCH", "/v1/machines"))
    assert (got.status, got.reason) == (405, "method_not_allowed")
    assert got.headers["allow"] == "GET, POST"
    assert got.body["details"]["allowed"] == ["GET", "POST"]
    auth = {"Authorization": f"Bearer {servers.token}"}
    got = await raw(servers.broker, request_bytes("PUT", "/v1/apps/demo", headers=auth))
    assert got.status == 405 and "DELETE" in got.headers["allow"]


@pytest.mark.parametrize("side", ["worker", "broker"])
async def test_404_is_json(servers: Servers, side: str) -> None:
    auth = {"Authorization": f"Bearer {servers.token}"}
    got = await raw(getattr(servers, side), request_bytes("GET", "/no/such/thing", headers=auth))
    assert (got.status, got.reason) == (404, "not_found")
    assert "/no/such/thing" in got.body["error"]


def _fill(path: str) -> str:
    return (
        path.replace("{app}", "demo")
        .replace("{id}", "abcdef123456")
        .replace("{key}", "k")
        .replace("{secret_name}", "S")
        .replace("{worker}", "w1")
    )


async def test_deep_json_is_a_400_on_every_json_endpoint(servers: Servers) -> None:
    worker_routes = [r for r in worker_http.ROUTES if r.body is not None]
    assert len(worker_routes) >= 6
    for route in worker_routes:
        got = await raw(servers.worker, request_bytes(route.method, _fill(route.path), DEEP))
        assert (got.status, got.reason) == (400, "invalid_json"), (route.path, got)
    auth = {"Authorization": f"Bearer {servers.token}"}
    # The broker's table, as the server registers it.
    broker_routes = [r for r in BROKER_ROUTES if r.body is not None]
    assert len(broker_routes) >= 8
    for route in broker_routes:
        req = request_bytes(route.method, _fill(route.path), DEEP, headers=auth)
        got = await raw(servers.broker, req)
        assert (got.status, got.reason) == (400, "invalid_json"), (route.path, got)


@contextlib.asynccontextmanager
async def other_servers() -> AsyncIterator[dict[str, str]]:
    """The proxy and `souk catalog serve` (with and without a secret), as they are served."""
    bus = InProcessBus()
    try:
        async with (
            following(bus, bootstrap=False) as replica,
            catalog_site(replica, "127.0.0.1", 0, None) as open_catalog,
            catalog_site(replica, "127.0.0.1", 0, b"catalog-secret-0123456789") as catalog,
            proxy_site(FakeView(), ProxySettings(port=0, api="http://127.0.0.1:9")) as (_, proxy),
        ):
            yield {"proxy": proxy, "open catalog": open_catalog, "catalog": catalog}
    finally:
        await bus.close()


async def test_the_proxy_and_the_catalog_answer_early_errors_in_json() -> None:
    async with other_servers() as urls:
        for name, url in urls.items():
            line = "Bearer " + "q" * 40_000  # over the proxy's larger limit too
            got = await raw(url, request_bytes("GET", "/x", headers={"Authorization": line}))
            assert (got.status, got.reason) == (431, "headers_too_large"), name
            assert "qqqq" not in str(got.body)
            got = await raw(url, b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (got.status, got.reason) == (400, "bad_request"), name


async def test_a_unicode_digit_is_not_a_change_number() -> None:
    async with other_servers() as urls:
        for since in ("\u00b2", "\u0663", "-1", "1.5"):
            path = "/v1/catalog/changes?since=" + quote(since)
            got = await raw(urls["open catalog"], request_bytes("GET", path))
            assert (got.status, got.reason) == (400, "invalid"), since
            assert got.body["error"].startswith("since:")

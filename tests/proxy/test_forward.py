"""Forwarding through a real proxy to real loopback backends: streaming both ways, headers,
failover and concurrency limits. Machines come from a hand-written catalog view."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from souk.proxy.policy import ServicePolicy
from souk.proxy.server import Proxy, ProxySettings, proxy_site
from tests.support.catalog_view import FakeView
from tests.support.ports import closed_port

DEAD_BROKER = "http://127.0.0.1:9"
MIB = 1024 * 1024


class Backend:
    """A real HTTP server standing in for one machine's app."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[dict[str, str]] = []
        self.gate = asyncio.Event()
        self.inflight = 0
        self.peak = 0
        app = web.Application()
        app.router.add_route("*", "/echo", self.echo)
        app.router.add_post("/sha", self.sha)
        app.router.add_post("/gated-upload", self.gated_upload)
        app.router.add_get("/drip", self.drip)
        app.router.add_get("/gzip", self.gz)
        app.router.add_get("/empty", self.empty)
        app.router.add_get("/slow", self.slow)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    async def echo(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.headers))
        body = await request.read()
        return web.json_response(
            {
                "name": self.name,
                "method": request.method,
                "len": len(body),
                "qs": request.query_string,
            },
            headers={"Proxy-Authenticate": "Basic", "Keep-Alive": "timeout=9", "X-Kept": "yes"},
        )

    async def sha(self, request: web.Request) -> web.Response:
        digest = hashlib.sha256()
        async for chunk in request.content.iter_any():
            digest.update(chunk)
        return web.json_response({"sha": digest.hexdigest(), "name": self.name})

    async def gated_upload(self, request: web.Request) -> web.Response:
        first = await request.content.readany()
        self.gate.set()  # the client sends the rest only now: the proxy must not wait for it
        rest = await request.read()
        return web.json_response({"len": len(first) + len(rest)})

    async def drip(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"first;")
        await asyncio.wait_for(self.gate.wait(), 10)  # set by the client once it has "first;"
        await resp.write(b"second")
        await resp.write_eof()
        return resp

    async def gz(self, request: web.Request) -> web.Response:
        return web.Response(
            body=gzip.compress(b"hello " * 1000, mtime=0),
            headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"},
        )

    async def empty(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def slow(self, request: web.Request) -> web.Response:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            await asyncio.wait_for(self.gate.wait(), 10)
        finally:
            self.inflight -= 1
        return web.json_response({"name": self.name})


@contextlib.asynccontextmanager
async def backends(*names: str) -> AsyncIterator[dict[str, Backend]]:
    found = {name: Backend(name) for name in names}
    async with contextlib.AsyncExitStack() as stack:
        for b in found.values():
            await stack.enter_async_context(b.server)
        yield found


@contextlib.asynccontextmanager
async def proxy_over(view: FakeView, **opts: Any) -> AsyncIterator[tuple[Proxy, str]]:
    # The backends are this test's own servers, not machines a worker runs: nothing to ask.
    options = ProxySettings(
        port=0, api=DEAD_BROKER, token="t", autostop=False, check_sockets=False, **opts
    )
    async with proxy_site(view, options) as (proxy, url):
        for row in view.rows.values():  # limits known up front: the broker here is unreachable
            proxy.policies.put(row.id, row.instance_id, ServicePolicy())
        yield proxy, url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        yield s


APP = {"souk-app": "web"}


async def test_routes_by_header_and_host_and_says_who_answered(
    http: aiohttp.ClientSession,
) -> None:
    async with backends("one") as bs:
        view = FakeView()
        view.add("m1", region="mad", port=bs["one"].port)
        async with proxy_over(view, region="mad") as (_, url):
            async with http.get(f"{url}/echo?x=1", headers=APP) as resp:
                assert resp.status == 200
                body = await resp.json()
                assert body == {"name": "one", "method": "GET", "len": 0, "qs": "x=1"}
                assert resp.headers["souk-machine"] == "m1"
                assert resp.headers["souk-region"] == "mad"
                assert resp.headers["X-Kept"] == "yes"
                assert "Proxy-Authenticate" not in resp.headers
                assert "Keep-Alive" not in resp.headers
            async with http.get(f"{url}/echo", headers={"Host": "web.souk.local:80"}) as resp:
                assert resp.status == 200
            seen = bs["one"].seen[-1]
            assert seen["Host"] == "web.souk.local:80"
            assert seen["X-Forwarded-For"] == "127.0.0.1"
            assert seen["X-Forwarded-Host"] == "web.souk.local:80"
            assert seen["X-Forwarded-Proto"] == "http"


async def test_hop_by_hop_request_headers_are_dropped(http: aiohttp.ClientSession) -> None:
    async with backends("one") as bs:
        view = FakeView()
        view.add("m1", port=bs["one"].port)
        async with proxy_over(view) as (_, url):
            headers = {
                **APP,
                "Connection": "keep-alive, X-Secret",
                "X-Secret": "1",
                "Proxy-Authorization": "Basic eA==",
                "X-Forwarded-For": "10.0.0.1",
                "X-Visible": "v",
            }
            async with http.get(f"{url}/echo", headers=headers) as resp:
                assert resp.status == 200
        seen = {k.lower(): v for k, v in bs["one"].seen[-1].items()}
        assert "x-secret" not in seen and "proxy-authorization" not in seen
        assert seen["x-visible"] == "v"
        assert seen["x-forwarded-for"] == "127.0.0.1"  # the client's own claim is not passed on


async def test_forwarding_headers_a_client_sends_are_replaced_by_what_the_proxy_saw(
    http: aiohttp.ClientSession,
) -> None:
    async with backends("one") as bs:
        view = FakeView()
        view.add("m1", port=bs["one"].port)
        async with proxy_over(view) as (_, url):
            claims = {
                **APP,
                "Host": "web.souk.local",
                "X-Forwarded-For": "10.9.9.9",
                "X-Forwarded-Host": "evil.example",
                "X-Forwarded-Proto": "https",
                "X-Forwarded-Port": "443",
                "X-Forwarded-Prefix": "/admin",
                "Forwarded": "for=10.9.9.9;proto=https;host=evil.example",
                "X-Real-IP": "10.9.9.9",
            }
            async with http.get(f"{url}/echo", headers=claims) as resp:
                assert resp.status == 200
        seen = {k.lower(): v for k, v in bs["one"].seen[-1].items()}
        assert seen["x-forwarded-for"] == "127.0.0.1"
        assert seen["x-forwarded-host"] == "web.souk.local"
        assert seen["x-forwarded-proto"] == "http"
        assert seen["x-forwarded-port"] == url.rsplit(":", 1)[1]
        assert "x-forwarded-prefix" not in seen
        assert "forwarded" not in seen and "x-real-ip" not in seen


async def test_force_https_is_not_talked_out_of_its_redirect(http: aiohttp.ClientSession) -> None:
    async with backends("one") as bs:
        view = FakeView()
        row = view.add("m1", port=bs["one"].port)
        async with proxy_over(view) as (proxy, url):
            proxy.policies.put(row.id, row.instance_id, ServicePolicy(force_https=True))
            claims = {
                **APP,
                "Host": "web.souk.local",
                "X-Forwarded-Proto": "https",
                "X-Forwarded-Host": "evil.example",
                "Forwarded": "proto=https;host=evil.example",
            }
            async with http.get(f"{url}/echo?a=1", headers=claims, allow_redirects=False) as resp:
                assert resp.status == 301
                assert resp.headers["Location"] == "https://web.souk.local/echo?a=1"
        assert bs["one"].seen == []  # redirected: nothing reached the machine


async def test_large_bodies_stream_both_ways(http: aiohttp.ClientSession) -> None:
    async with backends("one") as bs:
        view = FakeView()
        view.add("m1", port=bs["one"].port)
        async with proxy_over(view) as (_, url):
            blob = os.urandom(MIB)
            digest = hashlib.sha256()

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(24):
                    digest.update(blob)
                    yield blob

            async with http.post(f"{url}/sha", headers=APP, data=chunks()) as resp:
                assert resp.status == 200
                assert (await resp.json())["sha"] == digest.hexdigest()
            sized = os.urandom(3 * MIB + 7)
            async with http.post(f"{url}/sha", headers=APP, data=sized) as resp:
                assert (await resp.json())["sha"] == hashlib.sha256(sized).hexdigest()


async def test_request_body_is_not_buffered(http: aiohttp.ClientSession) -> None:
    async with backends("one") as bs:
        view = FakeView()
        view.add("m1", port=bs["one"].port)
        async with proxy_over(view) as (_, url):

            async def chunks() -> AsyncIterator[bytes]:
                yield b"x" * 1000
                await asyncio.wait_for(bs["one"].gate.wait(), 10)  # the backend has the start
                yield b"y" * 1000

            async with http.post(f"{url}/gated-upload", headers=APP, data=chunks()) as resp:
                assert (await resp.json()) == {"len": 2000}


async def test_chunked_response_is_relayed_as_it_comes(http: aiohttp.ClientSession) -> None:
    async with backends("one") as bs:
        view = FakeView()
        view.add("m1", port=bs["one"].port)
        async with (
            proxy_over(view) as (_, url),
            http.get(f"{url}/drip", headers=APP) as resp,
        ):
            assert resp.headers.get("Transfer-Encoding") == "chunked"
            first = b""
            while not first.endswith(b";"):
                first += await asyncio.wait_for(resp.content.readany(), 10)
            assert first == b"first;"
            bs["one"].gate.set()
            assert await resp.read() == b"second"


async def test_compressed_bodies_pass_untouched_and_empty_answers(
    http: aiohttp.ClientSession,
) -> None:
    async with backends("one") as bs:
        view = FakeView()
        view.add("m1", port=bs["one"].port)
        async with proxy_over(view) as (_, url):
            headers = {**APP, "Accept-Encoding": "gzip"}
            async with http.get(f"{url}/gzip", headers=headers) as resp:
                assert resp.headers["Content-Encoding"] == "gzip"
                assert gzip.decompress(await resp.read()) == b"hello " * 1000
            async with http.get(f"{url}/empty", headers=APP) as resp:
                assert resp.status == 204 and await resp.read() == b""
            async with http.head(f"{url}/gzip", headers=APP) as resp:
                assert resp.status == 200 and await resp.read() == b""
                assert resp.headers["souk-machine"] == "m1"


async def test_own_answers_and_unnamed_apps(http: aiohttp.ClientSession) -> None:
    view = FakeView()
    async with proxy_over(view) as (_, url):
        async with http.get(f"{url}/.souk/health") as resp:
            assert resp.status == 200 and (await resp.json())["ok"] is True
        async with http.get(f"{url}/.souk/status") as resp:  # operators only
            assert resp.status == 401 and (await resp.json())["status"] == "unauthorized"
        # A token, but no broker to ask what it allows: refused, never waved through.
        bearer = {"Authorization": "Bearer souk1_x.y"}
        async with http.get(f"{url}/.souk/status", headers=bearer) as resp:
            assert resp.status == 503 and (await resp.json())["status"] == "broker_unreachable"
        async with http.get(f"{url}/anything") as resp:
            assert resp.status == 404
            assert (await resp.json())["code"] == "app_not_found"
        # The catalog knows no such app and the broker cannot be asked: 503, not a guess of 404.
        async with http.get(f"{url}/x", headers={"souk-app": "ghost"}) as resp:
            assert resp.status == 503
            assert (await resp.json())["code"] == "no_machines"
        # Apps the catalog shows: deleted is 404; present without machines is 503.
        view.add_app("gone", deleted=True)
        view.add_app("empty")
        async with http.get(f"{url}/x", headers={"souk-app": "gone"}) as resp:
            assert resp.status == 404 and (await resp.json())["code"] == "app_not_found"
        async with http.get(f"{url}/x", headers={"souk-app": "empty"}) as resp:
            assert resp.status == 503 and (await resp.json())["code"] == "no_machines"


async def test_a_refused_connection_is_retried_elsewhere_even_for_post(
    http: aiohttp.ClientSession,
) -> None:
    async with backends("good") as bs:
        view = FakeView()
        view.add("bad", region="mad", port=closed_port())
        view.add("good", region="ams", port=bs["good"].port)
        async with proxy_over(view, region="mad") as (proxy, url):
            for _ in range(3):
                async with http.post(f"{url}/echo", headers=APP, data=b"z" * 100) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["len"] == 100
                    assert resp.headers["souk-machine"] == "good"
            # The refusing machine was put out of rotation after the first refusal.
            assert proxy.forwarder.stats["connect_failures"] == 1
            assert proxy.router.marks.has("failed", "bad")


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def beside_a_good_one(
    misbehaving: str, handle: RawHandler
) -> AsyncIterator[tuple[Proxy, str, Backend]]:
    """A proxy in region mad, whose nearest machine is a raw backend answering as `handle`
    does, and the app's other machine, "good", a well-behaved one in ams."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        async with backends("good") as bs:
            view = FakeView()
            view.add(misbehaving, region="mad", port=server.sockets[0].getsockname()[1])
            view.add("good", region="ams", port=bs["good"].port)
            async with proxy_over(view, region="mad") as (proxy, url):
                yield proxy, url, bs["good"]
    finally:
        server.close()
        await server.wait_closed()


async def drop_after_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A backend that reads the request head, then hangs up without answering."""
    await reader.readuntil(b"\r\n\r\n")
    writer.close()


async def test_after_sending_only_idempotent_requests_are_retried(
    http: aiohttp.ClientSession,
) -> None:
    async with beside_a_good_one("drop", drop_after_headers) as (proxy, url, good):
        async with http.get(f"{url}/echo", headers=APP) as resp:
            assert resp.status == 200
            assert resp.headers["souk-machine"] == "good"
        async with http.put(f"{url}/echo", headers=APP, data=b"small") as resp:
            assert resp.status == 200  # idempotent, body held for a replay
        async with http.post(f"{url}/echo", headers=APP, data=b"once") as resp:
            assert resp.status == 502
            assert (await resp.json())["code"] == "bad_gateway"
        assert len(good.seen) == 2
        assert not proxy.router.marks.has("failed", "drop")  # it did accept


async def break_off_mid_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A backend stopped mid-answer: its head and part of a short body, then gone."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\nContent-Type: text/plain\r\n\r\npart")
    await writer.drain()
    writer.close()


async def test_a_short_answer_broken_off_is_retried_not_relayed_truncated(
    http: aiohttp.ClientSession,
) -> None:
    async with beside_a_good_one("broken", break_off_mid_answer) as (proxy, url, _):
        async with http.get(f"{url}/echo", headers=APP) as resp:
            assert resp.status == 200
            assert resp.headers["souk-machine"] == "good"
            assert (await resp.json())["name"] == "good"  # whole: it parses
        async with http.post(f"{url}/echo", headers=APP, data=b"once") as resp:
            assert resp.status == 502  # not sent twice, and not half an answer
            assert (await resp.json())["code"] == "bad_gateway"
        assert proxy.forwarder.stats["retries"] >= 1


async def test_hard_limit_holds_requests_until_a_slot_frees(http: aiohttp.ClientSession) -> None:
    async with backends("one") as bs:
        view = FakeView()
        view.add("m1", port=bs["one"].port)
        async with proxy_over(view) as (proxy, url):
            proxy.policies.put("m1", "i-m1", ServicePolicy(soft_limit=1, hard_limit=2))

            async def call() -> int:
                async with http.get(f"{url}/slow", headers=APP) as resp:
                    await resp.read()
                    return resp.status

            calls = [asyncio.create_task(call()) for _ in range(5)]
            while bs["one"].inflight < 2:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            assert bs["one"].inflight == 2  # the other three wait at the proxy
            bs["one"].gate.set()
            assert await asyncio.gather(*calls) == [200] * 5
            assert bs["one"].peak == 2


async def test_a_client_that_leaves_mid_response_frees_its_slot() -> None:
    async with backends("one") as bs:
        view = FakeView()
        view.add("m1", port=bs["one"].port)
        async with proxy_over(view) as (proxy, url):
            async with aiohttp.ClientSession() as client:
                resp = await client.get(f"{url}/drip", headers=APP)
                assert await asyncio.wait_for(resp.content.readany(), 10) == b"first;"
                assert proxy.loads.of("m1") == 1
                resp.close()  # hang up with the response half read
            bs["one"].gate.set()
            for _ in range(500):
                if proxy.loads.of("m1") == 0:
                    break
                await asyncio.sleep(0.01)
            assert proxy.loads.of("m1") == 0

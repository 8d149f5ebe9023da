"""What an image reference can make a worker reach, through the public `images/pin` with an app
token, on a whole cluster with real runc: a listed registry's redirect to another loopback
service is not followed and nothing of that service's answer comes back; a link-local address
is never asked; and a closed port, a TLS port, a web server that is no registry and a refused
address all get the one answer, so that the route scans no ports.

Before: the worker followed the redirect and returned the target's body in its 502
(`... 403 INTERNAL-ONLY: db_password=...`), and the error told closed, TLS and open ports apart."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from souk.broker.tokens import mint
from souk.dev import dev_cluster
from souk.node.cluster_secret import read_secret
from souk.pki.tls import server_context
from tests.support.pki import new_pki, serving
from tests.support.ports import closed_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("runc") is None or os.geteuid() != 0, reason="needs root and runc"
    ),
]

INTERNAL = "INTERNAL-ONLY: db_password=hunter2"
METADATA = "http://169.254.169.254/latest/meta-data/"


def internal_service(asked: list[str]) -> web.Application:
    """A service only the worker's host should reach, with a secret in every answer."""

    async def answer(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(status=403, text=INTERNAL)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


def redirecting_registry(target: str) -> web.Application:
    """A registry the worker lists (plain http, on loopback) whose every answer is a 302."""

    async def answer(request: web.Request) -> web.Response:
        if request.path == "/v2/":
            return web.json_response({})
        raise web.HTTPFound(target)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


def web_server() -> web.Application:
    """Open, speaking HTTP, and no registry: a page for anything, and a 404 that is not one."""

    async def answer(request: web.Request) -> web.Response:
        if request.path.endswith("/1"):
            return web.Response(status=404, text="<h1>Not Found</h1>", content_type="text/html")
        return web.Response(text="<html>welcome</html>", content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


@contextlib.asynccontextmanager
async def site(app: web.Application, tls: Any = None) -> AsyncIterator[str]:
    async with serving(app, tls) as port:
        yield f"127.0.0.1:{port}"


async def test_a_pin_reaches_only_registries_and_says_one_thing_when_it_cannot(
    tmp_path: Path,
) -> None:
    asked: list[str] = []
    files = new_pki(tmp_path / "pki").node("worker", "tls-port")
    async with contextlib.AsyncExitStack() as stack:
        internal = await stack.enter_async_context(site(internal_service(asked)))
        to_internal = await stack.enter_async_context(
            site(redirecting_registry(f"http://{internal}/internal"))
        )
        to_metadata = await stack.enter_async_context(site(redirecting_registry(METADATA)))
        other_web = await stack.enter_async_context(site(web_server()))
        tls = server_context(files, require_client_cert=False)
        tls_port = await stack.enter_async_context(site(web_server(), tls))
        closed = f"127.0.0.1:{closed_port()}"
        listed = (to_internal, to_metadata, other_web, tls_port, closed)
        dev = dev_cluster(
            tmp_path / "dev", port=0, proxy_port=0, insecure_registries=listed, cpus=2
        )
        d = await stack.enter_async_context(dev)
        http = await stack.enter_async_context(aiohttp.ClientSession())
        operator = {"Authorization": f"Bearer {d.token}"}
        async with http.post(f"{d.api}/v1/apps", json={"name": "site"}, headers=operator) as r:
            assert r.status == 201, await r.text()
        token = mint(read_secret(tmp_path / "dev" / "secret"), apps=["site"])
        app_token = {"Authorization": f"Bearer {token}"}

        async def pin(host: str) -> tuple[int, str, dict[str, Any]]:
            image = f"{host}/app:1"
            url = f"{d.api}/v1/apps/site/images/pin"
            body = {"image": image, "region": "mad"}
            async with http.post(url, json=body, headers=app_token) as resp:
                text = await resp.text()
                answer = await resp.json()
            assert INTERNAL not in text and "db_password" not in text, text
            assert "169.254" not in text.replace(image, ""), text
            return resp.status, text.replace(image, "IMAGE"), answer

        answers = {
            "a redirect to a loopback service": await pin(to_internal),
            "a redirect to the metadata address": await pin(to_metadata),
            "a closed port, listed": await pin(closed),
            "a TLS port, listed": await pin(tls_port),
            "a web server, listed": await pin(other_web),
            "the loopback service itself, unlisted": await pin(internal),
            "a closed port, unlisted": await pin(f"127.0.0.1:{closed_port()}"),
            "a link-local address": await pin("169.254.169.254"),
            "loopback by name, unlisted": await pin(f"localhost:{to_internal.split(':')[1]}"),
        }
        status, text, answer = answers["a redirect to a loopback service"]
        assert (status, answer["code"]) == (502, "registry_unavailable"), text
        assert answer["error"] == f"could not fetch {to_internal}/app:1 from its registry"
        shapes = {name: (s, t) for name, (s, t, _) in answers.items()}
        assert len(set(shapes.values())) == 1, shapes
        assert asked == []  # neither the redirect nor the unlisted pin reached it

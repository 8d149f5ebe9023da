"""The proxy's own routes, walked with every kind of token: it asks a real broker what each
token allows, and answers as each route's declared permission says."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from souk.broker import tokens as tk
from souk.broker.runtime import BrokerSettings, broker_site
from souk.catalog.bus import InProcessBus
from souk.proxy.server import ProxySettings, proxy_site
from tests.broker.permissions import token_kinds, walk
from tests.support.catalog_view import FakeView

SECRET = b"proxy-routes-secret-0123456789"


async def test_the_proxys_own_routes_answer_as_they_declare(tmp_path: Path) -> None:
    bus = InProcessBus()
    operator = {"Authorization": f"Bearer {tk.mint(SECRET, operator=True)}"}
    kinds, revoked = token_kinds(SECRET, "demo", "other")
    try:
        opts = BrokerSettings(
            host="127.0.0.1", port=0, secret=SECRET, workers=[], registry_dir=tmp_path / "registry"
        )
        async with broker_site(opts, bus) as broker, aiohttp.ClientSession() as http:
            url = f"{broker}/v1/tokens/{tk.inspect(revoked)[0]}"
            async with http.delete(url, headers=operator) as resp:
                assert resp.status == 200, await resp.text()
            options = ProxySettings(port=0, api=broker, token="unused", autostop=False)
            async with proxy_site(FakeView(), options) as (proxy, proxy_url):
                routes = list(proxy.own.routes.values())
                assert {r.permission.need for r in routes if r.permission} == {
                    "public",
                    "operator",
                }
                problems, made = await walk(proxy_url, routes, kinds, {})
                assert problems == [] and made == len(routes) * len(kinds)
                async with http.get(f"{proxy_url}/.souk/status", headers=operator) as resp:
                    assert "requests" in await resp.json()
                # The broker's reason for a bad token comes through.
                expired_token = next(k.token for k in kinds if k.name == "an expired token")
                expired = {"Authorization": f"Bearer {expired_token}"}
                async with http.get(f"{proxy_url}/.souk/status", headers=expired) as resp:
                    assert (await resp.json())["status"] == "token_expired"
                async with http.post(f"{proxy_url}/.souk/status", headers=operator) as resp:
                    assert resp.status == 405 and resp.headers["Allow"] == "GET"
    finally:
        await bus.close()

"""Every query parameter of every part's route table (the broker's with the catalog's, a worker's,
`souk catalog serve`'s, the proxy's own) sent huge, negative and not a number: never a 5xx, and
a parameter declared numeric (`souk.web.Number`) is a 400 `invalid` that names it. Before,
`/v1/catalog/changes?since=99999999999999999999999` was a 500 (OverflowError from SQLite)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import aiohttp

from souk.broker import tokens as tk
from souk.catalog.replica import following
from souk.cli.catalog import catalog_app, catalog_site
from souk.proxy.server import ProxySettings, proxy_site
from souk.web import Number, Route
from souk.web.routes import DECLARED
from souk.worker import http as worker_http
from tests.broker.permissions import BODY_METHODS, PARAM
from tests.broker.test_route_permissions import BODY, two_apps
from tests.support.broker_cluster import SECRET
from tests.support.catalog_view import FakeView
from tests.support.waiting import eventually

BAD = [
    "99999999999999999999999",
    "9" * 5000,  # past Python's int digit limit
    "-1",
    "-99999999999999999999999",
    "abc",
    "nan",
    "inf",
    "1e999",
    "0x10",
    "1_000",
]

PROMPT = {"timeout": "0"}  # a wait answers at once, whatever else it is sent


async def walk_queries(
    base: str, routes: Iterable[Route], fill: Mapping[str, str], token: str | None
) -> tuple[list[str], set[str]]:
    """Problems found, and the numeric parameters walked (as `METHOD path ?name`)."""
    problems: list[str] = []
    numeric: set[str] = set()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=30)  # a bound on a stuck stream, not a measurement
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        for route in routes:
            path = PARAM.sub(lambda m: fill[m.group(1)], route.path)
            for name, declared in route.query.items():
                if isinstance(declared, Number):
                    numeric.add(f"{route.method} {route.path} ?{name}")
                for value in BAD:
                    body = BODY if route.method in BODY_METHODS else None
                    where = f"{route.method} {route.path}?{name}={value[:30]}"
                    async with session.request(
                        route.method, base + path, params={**PROMPT, name: value}, json=body
                    ) as resp:
                        status, text = resp.status, await resp.text()
                    if status >= 500:
                        problems.append(f"{where}: {status} {text[:200]}")
                        continue
                    if status < 400 and not isinstance(declared, Number):
                        continue
                    try:
                        answer = json.loads(text)
                    except ValueError:
                        problems.append(f"{where}: {status} and no JSON error: {text[:200]}")
                        continue
                    if not answer.get("code"):
                        problems.append(f"{where}: {status} without a reason: {text[:200]}")
                    if isinstance(declared, Number) and (
                        status != 400
                        or answer.get("code") != "invalid"
                        or answer.get("details", {}).get("parameter") != name
                    ):
                        problems.append(f"{where}: {status} {text[:200]}, not a 400 naming it")
    return problems, numeric


async def test_every_query_parameter_of_every_part_refuses_what_is_not_its_number(
    tmp_path: Path,
) -> None:
    async with two_apps(tmp_path) as (c, bus, demo):
        operator = c.tokens["operator"]
        fill = {
            "app": "demo",
            "id": demo["id"],
            "worker": "m1",
            "key": "note",
            "secret_name": "S",
            "org": "personal",
            "snapshot_id": "snap",
            "inode": "1",
        }
        broker = str(c.broker.make_url("")).rstrip("/")
        assert c.broker.app is not None
        table = c.broker.app[DECLARED].values()
        problems, numeric = await walk_queries(broker, table, fill, operator)
        assert problems == []
        assert {
            "GET /v1/apps/{app}/machines/{id}/wait ?timeout",
            "GET /v1/orgs/{org}/machines ?limit",
            "GET /v1/platform/regions ?cpus",
            "GET /v1/platform/regions ?memory_mb",
            "GET /v1/catalog/changes ?since",
        } <= numeric

        engine = c.engines["m1"]
        assert engine.get(demo["id"], events=False)  # the machine the worker's paths name
        problems, numeric = await walk_queries(c.urls["m1"], worker_http.ROUTES, fill, None)
        assert problems == []
        assert "GET /v1/machines/{id}/wait ?timeout" in numeric

        async with following(bus, bootstrap=False) as replica:
            await eventually(lambda: replica.app("demo") is not None)
            async with catalog_site(replica, "127.0.0.1", 0, SECRET) as url:
                table = catalog_app(replica, SECRET)[DECLARED].values()
                problems, numeric = await walk_queries(url, table, fill, operator)
                assert problems == [] and numeric == {"GET /v1/catalog/changes ?since"}

        options = ProxySettings(port=0, api=broker, token="unused", autostop=False)
        async with proxy_site(FakeView(), options) as (proxy, proxy_url):
            routes = list(proxy.own.routes.values())
            problems, _ = await walk_queries(
                proxy_url, routes, fill, tk.mint(SECRET, operator=True)
            )
            assert problems == []

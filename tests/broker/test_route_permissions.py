"""Who may call what, route by route: the broker's whole route table (the catalog's routes
among them, as a broker on the bus serves them) and `souk catalog serve`'s, walked with every
kind of token. Each answer must follow from the permission its route declares."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from souk.broker import tokens as tk
from souk.catalog.bus import InProcessBus
from souk.catalog.replica import following
from souk.cli.catalog import catalog_app, catalog_site
from souk.web.routes import DECLARED
from tests.broker.permissions import expected, token_kinds, walk
from tests.broker.test_api import err, ok
from tests.support.broker_cluster import SECRET, Cluster, WorkerSpec, cluster, machine_body
from tests.support.waiting import eventually

SPECS = [WorkerSpec("m1", "mad"), WorkerSpec("a1", "ams")]
BODY = {"name": "demo", "region": "mad"}  # what a body names, for routes that read one


@contextlib.asynccontextmanager
async def two_apps(tmp_path: Path) -> AsyncIterator[tuple[Cluster, InProcessBus, dict[str, Any]]]:
    """A broker on the bus with apps demo and other, a machine each, both in the catalog."""
    bus = InProcessBus()
    try:
        async with cluster(tmp_path, SPECS, bus=bus) as c:
            await ok(await c.call("POST", "/v1/apps", json={"name": "other"}), 201)
            demo = await ok(await c.call("POST", "/v1/apps/demo/machines", json=machine_body()))
            await ok(await c.call("POST", "/v1/apps/other/machines", json=machine_body("ams")))
            view = c.fleet.view  # type: ignore[attr-defined]
            await eventually(lambda: view.app("other") and len(view.machines()) == 2)
            yield c, bus, demo
    finally:
        await bus.close()


async def revoke(c: Cluster, token: str) -> None:
    path = f"/v1/tokens/{tk.inspect(token)[0]}"
    await ok(await c.call("DELETE", path, token=c.tokens["operator"]))


async def end_streams(c: Cluster) -> None:
    """A row of each app, so that change streams whose callers left notice it on writing."""
    for app, region in (("demo", "mad"), ("other", "ams")):
        await ok(await c.call("POST", f"/v1/apps/{app}/machines", json=machine_body(region)))


async def test_every_broker_route_answers_every_kind_of_token_as_it_declares(
    tmp_path: Path,
) -> None:
    async with two_apps(tmp_path) as (c, _, demo):
        kinds, revoked = token_kinds(SECRET, "demo", "other")
        await revoke(c, revoked)
        app = c.broker.app
        assert app is not None
        table = app[DECLARED]
        served = {
            (r.method, r.resource.canonical)
            for r in app.router.routes()
            if r.resource is not None and r.method != "HEAD"
        }
        assert served == set(table)  # the walk covers every route the broker serves
        assert all(route.permission is not None for route in table.values())
        paths = {route.path for route in table.values()}
        assert {"/v1/apps/{app}/machines/{id}", "/v1/catalog/changes", "/v1/workers"} <= paths
        # Every permission the table uses is walked against every kind of token.
        assert {route.permission.need for route in table.values() if route.permission} == {
            "public",
            "token",
            "app",
            "operator",
        }
        fill = {
            "app": "demo",
            "id": demo["id"],
            "worker": "m1",
            "key": "note",
            "secret_name": "S",
            "org": "personal",
        }
        base = str(c.broker.make_url("")).rstrip("/")
        problems, made = await walk(base, table.values(), kinds, fill, BODY)
        assert problems == []
        assert made == len(table) * len(kinds)


async def test_catalog_serve_with_a_secret_checks_tokens_as_a_broker(tmp_path: Path) -> None:
    async with two_apps(tmp_path) as (c, bus, demo):
        kinds, revoked = token_kinds(SECRET, "demo", "other")
        await revoke(c, revoked)
        async with following(bus, bootstrap=False) as replica:
            await eventually(lambda: replica.revoked(tk.inspect(revoked)[0]))
            await eventually(lambda: replica.app("other") and len(replica.machines()) == 2)
            async with catalog_site(replica, "127.0.0.1", 0, SECRET) as url:
                table = catalog_app(replica, SECRET)[DECLARED]
                assert {r.path for r in table.values()} == {
                    "/openapi.json",
                    "/v1/catalog/workers",
                    "/v1/catalog/machines",
                    "/v1/catalog/apps/{app}/regions",
                    "/v1/catalog/status",
                    "/v1/catalog/changes",
                    "/metrics",
                }
                fill = {"app": "demo", "id": demo["id"]}
                problems, made = await walk(url, table.values(), kinds, fill, BODY)
                assert problems == [] and made == len(table) * len(kinds)
                await end_streams(c)
            # Without a secret it checks nothing, as before: anyone reads everything.
            async with (
                catalog_site(replica, "127.0.0.1", 0, None) as url,
                aiohttp.ClientSession() as http,
                http.get(f"{url}/v1/catalog/workers") as resp,
            ):
                assert resp.status == 200 and {w["id"] for w in await resp.json()} == {"m1", "a1"}


async def read_until(resp: Any, machine_id: str) -> list[dict[str, Any]]:
    """Changes from an open stream, up to the first row of the machine."""
    seen: list[dict[str, Any]] = []
    try:
        assert resp.status == 200, await resp.text()
        while True:
            change = json.loads(await resp.content.readline())
            seen.append(change)
            if change["table"] == "machines" and change["key"] == machine_id:
                return seen
    finally:
        resp.close()


def owner_app(change: dict[str, Any]) -> str | None:
    if change["table"] == "apps":
        return str(change["key"])
    if change["table"] == "machines" and change["row"] is not None:
        return str(change["row"]["app"])
    return None


async def test_an_app_token_sees_its_own_apps_rows_in_the_catalog(tmp_path: Path) -> None:
    async with two_apps(tmp_path) as (c, _, demo):
        token = c.tokens["demo-read"]
        rows = await ok(await c.call("GET", "/v1/catalog/machines", token=token))
        assert [m["id"] for m in rows] == [demo["id"]]
        everything = await ok(await c.call("GET", "/v1/catalog/machines"))
        assert {m["app"] for m in everything} == {"demo", "other"}  # a token for every app
        q = {"app": "other"}
        await err(await c.call("GET", "/v1/catalog/machines", token=token, params=q), 403)
        assert await ok(await c.call("GET", "/v1/catalog/apps/demo/regions", token=token))
        await err(await c.call("GET", "/v1/catalog/apps/other/regions", token=token), 403)
        for path in ("/v1/catalog/workers", "/v1/catalog/status"):
            await err(await c.call("GET", path, token=token), 403)
        q = {"table": "workers"}
        body = await err(await c.call("GET", "/v1/catalog/changes", token=token, params=q), 403)
        assert "workers" in body["error"]

        # The change stream from the start, read up to a machine made after it opened, so that
        # everything before it was replayed: demo's rows only; every row for an operator.
        since = {"since": "0"}
        mine = await c.call("GET", "/v1/catalog/changes", token=token, params=since)
        fleet = await c.call("GET", "/v1/catalog/changes", token=c.tokens["operator"], params=since)
        sentinel = await ok(await c.call("POST", "/v1/apps/demo/machines", json=machine_body()))
        seen = await read_until(mine, sentinel["id"])
        assert {(ch["table"], owner_app(ch)) for ch in seen} == {
            ("apps", "demo"),
            ("machines", "demo"),
        }
        seen = await read_until(fleet, sentinel["id"])
        assert {ch["table"] for ch in seen} >= {"workers", "machines", "apps"}
        assert {owner_app(ch) for ch in seen} >= {"demo", "other"}


def test_expected_answers_follow_the_declared_permission() -> None:
    """The walk's oracle on its own: a few declarations and kinds, spelled out."""
    from souk.web import Permission, in_path

    kinds = {k.name: k for k in token_kinds(SECRET, "demo", "other")[0]}
    read = Permission.app_read(in_path("app"))
    assert expected(read, kinds["a read-only token"], "demo") is None
    assert expected(read, kinds["another app's token"], "demo") == 403
    assert expected(Permission.app_write(in_path("app")), kinds["a read-only token"], "demo")
    assert expected(Permission.operator(), kinds["a token for every app"], "demo") == 403
    assert expected(Permission.public(), kinds["no token"], "demo") is None
    assert expected(Permission.token(), kinds["an expired token"], "demo") == 401
    assert expected(None, kinds["an operator token"], "demo") == 403

"""A stream lasts as long as its token: revoked or expired, the token no longer reads the
catalog's changes nor a machine's followed output, though the stream was let in when it held.
Before, an open `/v1/catalog/changes` kept delivering rows after its token was revoked."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from souk.broker import tokens as tk
from souk.catalog.bus import InProcessBus
from souk.catalog.replica import following
from souk.cli.catalog import catalog_site
from tests.broker.test_api import err, ok
from tests.broker.test_route_permissions import revoke, two_apps
from tests.support.broker_cluster import SECRET, WorkerSpec, cluster, machine_body
from tests.support.waiting import eventually

CHANGES = "/v1/catalog/changes"
ENDS_WITHIN = 20.0  # a bound on a stream that never ends, not a measurement


async def read_to_end(resp: Any) -> list[bytes]:
    """Every line left in the stream, up to its end; a TimeoutError if it does not end."""
    lines: list[bytes] = []
    async with asyncio.timeout(ENDS_WITHIN):
        while line := await resp.content.readline():
            lines.append(line)
    return lines


async def first_row(resp: Any) -> dict[str, Any]:
    assert resp.status == 200, await resp.text()
    async with asyncio.timeout(ENDS_WITHIN):
        row: dict[str, Any] = json.loads(await resp.content.readline())
    return row


async def test_a_changes_stream_ends_once_its_token_is_revoked(tmp_path: Path) -> None:
    async with two_apps(tmp_path) as (c, _, _demo):
        token = tk.mint(SECRET, apps=["demo"])
        stream = await c.call("GET", CHANGES, token=token, params={"since": "0"})
        try:
            assert (await first_row(stream))["table"] in ("apps", "machines")
            await revoke(c, token)
            # Rows keep coming to the app; none of them reaches the revoked stream's reader.
            made = await ok(await c.call("POST", "/v1/apps/demo/machines", json=machine_body()))
            rest = await read_to_end(stream)
            assert all(json.loads(line).get("key") != made["id"] for line in rest)
        finally:
            stream.close()
        body = await err(await c.call("GET", CHANGES, token=token, params={"since": "0"}), 401)
        assert body["code"] == "token_revoked"


async def test_a_changes_stream_ends_once_its_token_expires(tmp_path: Path) -> None:
    async with two_apps(tmp_path) as (c, _, _demo):
        token = tk.attenuate(tk.mint(SECRET, apps=["demo"]), [f"expires={int(time.time()) + 2}"])
        stream = await c.call("GET", CHANGES, token=token, params={"since": "0"})
        try:
            await first_row(stream)
            await read_to_end(stream)
        finally:
            stream.close()


async def test_catalog_serve_ends_a_revoked_token_s_stream(tmp_path: Path) -> None:
    async with two_apps(tmp_path) as (c, bus, _demo):
        token = tk.mint(SECRET, apps=["demo"])
        async with (
            following(bus, bootstrap=False) as replica,
            catalog_site(replica, "127.0.0.1", 0, SECRET) as url,
        ):
            await eventually(lambda: replica.app("demo") is not None)
            headers = {"Authorization": f"Bearer {token}"}
            async with c.broker.session.get(
                f"{url}{CHANGES}", headers=headers, params={"since": "0"}
            ) as stream:
                await first_row(stream)
                await revoke(c, token)
                await read_to_end(stream)


async def test_followed_logs_end_once_their_token_is_revoked(tmp_path: Path) -> None:
    bus = InProcessBus()
    try:
        specs = [WorkerSpec("p1", "mad", driver="process")]
        async with cluster(tmp_path, specs, bus=bus) as c:
            talking = machine_body()
            talking["config"]["init"]["exec"] = ["sh", "-c", "while :; do echo hi; sleep 0.1; done"]
            m = await ok(await c.call("POST", "/v1/apps/demo/machines", json=talking))
            await ok(
                await c.call(
                    "GET", f"/v1/apps/demo/machines/{m['id']}/wait", params={"timeout": "20"}
                )
            )
            token = tk.mint(SECRET, apps=["demo"])
            path = f"/v1/apps/demo/machines/{m['id']}/logs"
            logs = await c.call("GET", path, token=token, params={"follow": "true"})
            try:
                assert logs.status == 200, await logs.text()
                async with asyncio.timeout(ENDS_WITHIN):
                    assert await logs.content.readline() == b"hi\n"
                await revoke(c, token)
                await read_to_end(logs)
            finally:
                logs.close()
    finally:
        await bus.close()


async def test_the_dashboard_s_events_end_once_its_token_is_revoked(tmp_path: Path) -> None:
    bus = InProcessBus()
    try:
        async with cluster(tmp_path, [WorkerSpec("m1", "mad")], bus=bus) as c:
            operator = tk.mint(SECRET, operator=True)
            events = await c.broker.get("/ui/events", headers=c.auth(operator))
            try:
                assert events.status == 200, await events.text()
                async with asyncio.timeout(ENDS_WITHIN):
                    assert await events.content.readline() == b"retry: 2000\n"
                await revoke(c, operator)
                await read_to_end(events)  # within the stream's tick (5 s)
            finally:
                events.close()
    finally:
        await bus.close()

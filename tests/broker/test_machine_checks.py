"""Health checks observed by the worker reach the public API unchanged."""

from __future__ import annotations

import asyncio
import sys
import time

from tests.support.broker_cluster import ClusterFactory, WorkerSpec

M = "/v1/apps/demo/machines"


async def test_checks_come_through_the_public_api(make_cluster: ClusterFactory) -> None:
    serve = f'exec {sys.executable} -m http.server 8080 --bind "$SOUK_PRIVATE_IP"'
    config = {
        "init": {"exec": ["sh", "-c", serve]},
        "checks": {
            "web": {"type": "http", "port": 8080, "path": "/"},
            "closed": {"type": "tcp", "port": 9},
        },
    }
    async with make_cluster([WorkerSpec("m1", "mad", driver="process")]) as c:
        resp = await c.call("POST", M, json={"region": "mad", "config": config})
        assert resp.status == 200, await resp.text()
        mid = (await resp.json())["id"]
        deadline = time.monotonic() + 20
        checks: dict[str, dict[str, str]] = {}
        while time.monotonic() < deadline:
            machine = await (await c.call("GET", f"{M}/{mid}")).json()
            checks = {check["name"]: check for check in machine["checks"]}
            statuses = {name: check["status"] for name, check in checks.items()}
            if statuses == {"web": "passing", "closed": "critical"}:
                break
            await asyncio.sleep(0.05)
        assert checks["web"]["status"] == "passing", checks
        assert checks["closed"]["status"] == "critical" and ":9: " in checks["closed"]["output"]
        listed = await (await c.call("GET", M)).json()
        assert {check["name"] for check in listed[0]["checks"]} == {"web", "closed"}
        await c.call("DELETE", f"{M}/{mid}", params={"force": "true"})

"""Health checks run by a real worker against a real HTTP server in a machine."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from souk.models.machine import Check, CreateMachine
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.machines.checks import HealthChecks
from tests.support.clients import Client
from tests.support.engines import settings

Checks = dict[str, dict[str, Any]]
SERVE = [sys.executable, "-m", "http.server", "8080"]


def http_server(checks: dict[str, Any]) -> dict[str, Any]:
    """A machine serving its working directory on its private address, port 8080."""
    argv = ["sh", "-c", f'exec {" ".join(SERVE)} --bind "$SOUK_PRIVATE_IP"']
    return {"app": "demo", "config": {"init": {"exec": argv}, "checks": checks}}


async def until(
    client: Client, mid: str, done: Callable[[Checks], bool], timeout: float = 20
) -> Checks:
    """Poll the machine's checks until `done` holds (as a deploy would), or fail."""
    deadline = time.monotonic() + timeout
    checks: Checks = {}
    while time.monotonic() < deadline:
        machine = await (await client.get(f"/v1/machines/{mid}")).json()
        checks = {c["name"]: c for c in machine["checks"]}
        if done(checks):
            return checks
        await asyncio.sleep(0.05)
    raise AssertionError(f"checks never got there: {checks}")


async def test_checks_pass_fail_and_clear_on_stop(client: Client) -> None:
    checks = {
        "tcp": {"type": "tcp", "port": 8080, "interval": "30s"},
        "root": {"type": "http", "port": 8080, "path": "/", "interval": "30s"},
        "missing": {"type": "http", "port": 8080, "path": "/no-such-page", "interval": "1s"},
        "closed": {"type": "tcp", "port": 9, "interval": "1s"},
    }
    resp = await client.post("/v1/machines", json=http_server(checks))
    assert resp.status == 201, await resp.text()
    created = await resp.json()
    mid = created["id"]
    assert created["checks"] == [] or {c["status"] for c in created["checks"]} == {"warning"}

    def settled(c: Checks) -> bool:
        return (
            c.get("tcp", {}).get("status") == "passing"
            and c.get("root", {}).get("status") == "passing"
            and "404" in c.get("missing", {}).get("output", "")
        )

    seen = await until(client, mid, settled)
    assert seen["missing"]["status"] == "critical"
    assert "/no-such-page" in seen["missing"]["output"]
    assert seen["closed"]["status"] == "critical"
    assert "refused" in seen["closed"]["output"].lower()
    assert seen["root"]["output"].endswith("HTTP 200")
    assert all(c["updated_at"].endswith("Z") for c in seen.values())
    listed = await (await client.get("/v1/machines")).json()
    assert {c["name"] for c in listed[0]["checks"]} == set(checks)

    await client.post(f"/v1/machines/{mid}/stop", json={"timeout": "2s"})
    await client.get(f"/v1/machines/{mid}/wait", params={"state": "stopped"})
    machine = await (await client.get(f"/v1/machines/{mid}")).json()
    assert machine["checks"] == []

    await client.post(f"/v1/machines/{mid}/start")
    await until(client, mid, lambda c: c.get("root", {}).get("status") == "passing")
    await client.delete(f"/v1/machines/{mid}", params={"force": "true"})


async def test_failures_within_the_grace_period_are_warnings(client: Client) -> None:
    checks = {"slow": {"type": "tcp", "port": 9, "grace_period": "60s"}}
    resp = await client.post("/v1/machines", json=http_server(checks))
    mid = (await resp.json())["id"]
    seen = await until(client, mid, lambda c: "grace" in c.get("slow", {}).get("output", ""))
    assert seen["slow"]["status"] == "warning"
    await client.delete(f"/v1/machines/{mid}", params={"force": "true"})


async def test_an_http_check_that_does_not_answer_in_time_fails() -> None:
    """A server that accepts but never answers: the check gives up after its timeout."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)  # never answers; returns when the checker hangs up

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    checks = HealthChecks()
    try:
        async with server:
            check = Check(type="http", port=port, path="/healthz", timeout=0.2)
            ok, output = await checks.probe("127.0.0.1", check)
            assert not ok and "no answer within 0.2s" in output
            ok, output = await checks.probe("127.0.0.1", Check(type="tcp", port=port))
            assert ok and "connected" in output
    finally:
        await checks.close()


async def test_checks_are_observed_again_after_a_worker_restart(tmp_path: Path) -> None:
    s = settings(tmp_path)
    body = CreateMachine.model_validate(
        http_server({"web": {"type": "http", "port": 8080, "path": "/"}})
    )
    engine = Engine(s, make_driver("process", s))
    await engine.recover()
    mid = (await engine.create(body)).id
    assert (await engine.wait(mid, "started", 10, None))[0]
    await engine.close()  # the server lives on without its worker; its results do not

    async with running(Engine(s, make_driver("process", s))) as again:
        deadline = time.monotonic() + 20
        statuses: list[str] = []
        while time.monotonic() < deadline:
            statuses = [c.status for c in again.get(mid, events=False).checks]
            if statuses == ["passing"]:
                break
            await asyncio.sleep(0.05)
        assert statuses == ["passing"]
        await again.submit(mid, "destroy", {"force": True})
        assert (await again.wait(mid, "destroyed", 10, None))[0]
        assert again.get(mid, events=False).checks == []

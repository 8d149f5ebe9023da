"""Third-party Fly Machines API clients from PyPI, each through its own public API and unchanged,
against a real broker and real workers on loopback: pointed at souk only by what a user sets (the
base URL, a token, an app name, a region), each runs the ordinary scenario it supports.

Both libraries send only an image, never a command, so the worker runs the sim driver, which
takes an image reference without pulling it. It offers performance CPUs too: flaude asks for
them whatever its caller sets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import flaude
import pytest
from flaude import fly_client
from flaude.runner import wait_for_machine_exit
from sandboxer import (  # type: ignore[import-untyped]
    CreateSandboxRequest,
    Sandboxer,
    SandboxStatus,
)

from tests.support.broker_cluster import Cluster, WorkerSpec, cluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

REGION = "iad"  # both libraries' default region


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Cluster, str]]:
    """A cluster in the libraries' default region, and the broker's base URL."""
    worker = WorkerSpec("w1", REGION, driver="sim", cpu_kinds=("shared", "performance"))
    async with cluster(tmp_path, [worker]) as c:
        yield c, str(c.broker.make_url("")).rstrip("/")


async def test_flaude_runs_a_machine_through_its_lifecycle(
    served: tuple[Cluster, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, url = served
    # flaude has no base URL setting but its module's constant; the token comes from the env.
    monkeypatch.setattr(fly_client, "FLY_API_BASE", f"{url}/v1")
    monkeypatch.setenv("FLY_API_TOKEN", c.tokens["admin"])

    assert await flaude.get_app("jobs") is None  # a 404 to flaude
    assert (await flaude.ensure_app("jobs")).name == "jobs"  # created with app_name, org_slug
    assert await flaude.get_app("jobs") == flaude.FlyApp(name="jobs", org="personal")

    config = flaude.MachineConfig(
        claude_code_oauth_token="t",  # flaude refuses to build a create without these two
        prompt="say hi",
        region=REGION,
        vm_cpus=1,
        vm_memory_mb=256,
        auto_destroy=False,  # else the stop below destroys it
    )
    m = await flaude.create_machine("jobs", config, name="first")
    assert (m.name, m.region, m.app_name) == ("first", REGION, "jobs")
    assert m.id and m.instance_id and m.state in ("created", "starting", "started")
    # flaude waits only for an exit; for a start, its own low-level client asks Fly's route.
    waited = await fly_client.fly_get(f"/apps/jobs/machines/{m.id}/wait?state=started")
    assert waited == {"ok": True}
    assert (await flaude.get_machine("jobs", m.id)).state == "started"

    await flaude.stop_machine("jobs", m.id)
    state, _ = await wait_for_machine_exit("jobs", m.id, timeout=10)
    assert state == "stopped"

    await flaude.start_machine("jobs", m.id)
    assert (await flaude.get_machine("jobs", m.id)).state in ("starting", "started")

    await flaude.destroy_machine("jobs", m.id)  # forced, as flaude always does
    # A destroyed machine is still shown for a while, as on Fly.
    await eventually(lambda: _state_is("jobs", m.id, "destroyed"), timeout=5)


async def _state_is(app: str, machine_id: str, state: str) -> bool:
    return (await flaude.get_machine(app, machine_id)).state == state


def _sandboxer(c: Cluster, url: str, monkeypatch: pytest.MonkeyPatch) -> Sandboxer:
    """hyperterse-sandboxer's Fly provider takes its app and region from the environment only."""
    monkeypatch.setenv("FLY_APP_NAME", "demo")
    monkeypatch.setenv("FLY_REGION", REGION)
    return Sandboxer("fly-machines", {"api_key": c.tokens["demo"], "base_url": url})


async def test_sandboxer_creates_with_fields_outside_flys_spec(
    served: tuple[Cluster, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its create puts `auto_start_machines` (a fly.toml service setting) and `stop_timeout`
    (Fly's is `stop_config.timeout`) into the machine's config, neither of which is in Fly's
    `fly.MachineConfig`. Fly ignores unknown fields, so souk does, and names them in the
    machine's create event."""
    c, url = served
    box = _sandboxer(c, url, monkeypatch)
    try:
        sandbox, info = await asyncio.to_thread(
            box.create_sandbox, CreateSandboxRequest(template="alpine")
        )
        assert (info.id, info.template) == (sandbox.id, "alpine")
    finally:
        box.close()
    resp = await c.call("GET", f"/v1/apps/demo/machines/{sandbox.id}/events")
    launch = next(e for e in await resp.json() if e["type"] == "launch")
    assert launch["request"]["ignored_fields"] == [
        "config.auto_start_machines",
        "config.stop_timeout",
    ]


async def test_sandboxer_drives_a_fly_machine_it_did_not_create(
    served: tuple[Cluster, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rest of its scenario, on an image machine made through the broker: get (its attach and
    info), list, suspend and start (its pause and resume), then a forced destroy (its kill)."""
    c, url = served
    body = {"region": REGION, "config": {"image": "alpine:3.20", "guest": {"cpus": 1}}}
    resp = await c.call("POST", "/v1/apps/demo/machines", json=body)
    assert resp.status == 200, await resp.text()
    mid = (await resp.json())["id"]

    box = _sandboxer(c, url, monkeypatch)
    try:
        sandbox = await asyncio.to_thread(box.attach_sandbox, mid)
        got = await asyncio.to_thread(sandbox.info)
        assert (got.id, got.template, got.cpus, got.memory_mb) == (mid, "alpine:3.20", 1, 256)
        assert got.status == SandboxStatus.RUNNING
        listed = await asyncio.to_thread(box.list_sandboxes)
        assert [(s.id, s.metadata["region"]) for s in listed] == [(mid, REGION)]

        await asyncio.to_thread(sandbox.pause)
        await eventually(lambda: _state(c, mid, "suspended"), timeout=5)
        await asyncio.to_thread(sandbox.resume)
        await eventually(lambda: _state(c, mid, "started"), timeout=5)
        assert await asyncio.to_thread(sandbox.is_running)

        await asyncio.to_thread(sandbox.kill)
        await eventually(lambda: _state(c, mid, "destroyed"), timeout=5)
        assert await asyncio.to_thread(box.list_sandboxes) == []  # as Fly lists, without it
    finally:
        box.close()


async def _state(c: Cluster, machine_id: str, state: str) -> bool:
    resp = await c.call("GET", f"/v1/apps/demo/machines/{machine_id}")
    return resp.status == 200 and bool((await resp.json())["state"] == state)

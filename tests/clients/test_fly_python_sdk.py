"""fly-python-sdk (PyPI), through its own public API and unchanged, against a real broker and
a real worker on loopback. Its models decode Fly's answers strictly where Fly never sends a
field empty: `mounts` is one mount, not a list, so a `"mounts": []` fails every answer that
carries a machine. It sends only images, so the worker runs the sim driver.

Its package pins an httpx older than flaude's; scripts/setup.sh installs it without its
dependencies (its code runs on either)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker_cluster import Cluster, WorkerSpec, cluster
from tests.support.waiting import eventually

sdk: Any = pytest.importorskip("fly_python_sdk", reason="scripts/setup.sh installs it")
api: Any = pytest.importorskip("fly_python_sdk.fly.api")
machine_models: Any = pytest.importorskip("fly_python_sdk.models.machine")

pytestmark = pytest.mark.integration

REGION = "ams"


@pytest.fixture
async def served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Cluster, Any]]:
    """A cluster, and the library's `Fly` pointed at it. Its objects make the next ones with
    the default base URL whatever the caller set, so the default is what is pointed."""
    async with cluster(tmp_path, [WorkerSpec("w1", REGION, driver="sim")]) as c:
        url = str(c.broker.make_url("")).rstrip("/")
        timeout, version, _ = api.FlyApi.__init__.__defaults__
        monkeypatch.setattr(api.FlyApi.__init__, "__defaults__", (timeout, version, url))
        yield c, sdk.fly.Fly(c.tokens["admin"])


async def test_fly_python_sdk_runs_its_scenario(served: tuple[Cluster, Any]) -> None:
    c, fly = served
    org = fly.Org()
    await org.create_app("sdkapp")
    assert "sdkapp" in [a.name for a in await org.list_apps()]
    app = org.App("sdkapp")
    assert (await app.inspect()).name == "sdkapp"

    config = machine_models.FlyMachineConfig(
        image="alpine:3.20",
        env={"A": "1"},
        guest=machine_models.FlyMachineConfigGuest(cpu_kind="shared", cpus=1, memory_mb=256),
    )
    wanted = machine_models.FlyMachine(name="first", region=REGION, config=config)
    created = await app.create_machine(wanted)
    assert (created.name, created.region, created.config.env) == ("first", REGION, {"A": "1"})
    assert created.config.mounts is None and created.image_ref.repository == "library/alpine"

    listed = await app.list_machines(regions=[REGION], ids_only=True)
    assert listed == [created.id]
    machine = app.Machine(created.id)
    assert (await machine.inspect()).state in ("created", "starting", "started")
    clone = await machine.clone(name="second")
    assert (clone.name, clone.config.image) == ("second", "alpine:3.20")

    for mid in (created.id, clone.id):  # its own stop asks for a method it does not have
        resp = await c.call("POST", f"/v1/apps/sdkapp/machines/{mid}/stop")
        assert resp.status == 200, await resp.text()
        waited = await c.call(
            "GET", f"/v1/apps/sdkapp/machines/{mid}/wait", params={"state": "stopped"}
        )
        assert waited.status == 200, await waited.text()
    await machine.start()
    assert (await machine.inspect()).state in ("starting", "started")
    await c.call("POST", f"/v1/apps/sdkapp/machines/{created.id}/stop")
    await c.call("GET", f"/v1/apps/sdkapp/machines/{created.id}/wait", params={"state": "stopped"})
    await app.destroy_machines([created.id, clone.id])
    await eventually(lambda: _none_listed(app), timeout=5)  # as Fly lists, without them


async def _none_listed(app: Any) -> bool:
    return bool(await app.list_machines(ids_only=True) == [])

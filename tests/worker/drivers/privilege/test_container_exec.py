"""`exec` into an image machine of a root worker, through the worker API: the command runs in
the container (its network, its user namespace), as the container's root, which is the app's
own id on the host."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.worker.daemon import make_app, make_driver, running
from souk.worker.drivers import launcher
from souk.worker.engine import Engine
from souk.worker.machines import app_users
from souk.worker.oci.registry import RegistryClient
from souk.worker.settings import WorkerSettings
from tests.support.clients import Client
from tests.support.engines import destroy_all
from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.registry import Registry, push

from .conftest import needs_root

pytestmark = [
    pytest.mark.integration,
    needs_root,
    pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed"),
]


@pytest.fixture(params=[True, False], ids=["souk-launch", "python"])
async def api(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    registry: Registry,
    client: RegistryClient,
    worker_settings: WorkerSettings,
) -> AsyncIterator[Client]:
    """A worker that runs runc inside a machine's network namespace through souk-launch, or
    (without it) through Python."""
    if request.param and launcher.LAUNCHER is None:
        pytest.skip("souk-launch is not built (scripts/setup.sh builds it)")
    if not request.param:
        monkeypatch.setattr(launcher, "LAUNCHER", None)
    await push(client, registry, "box:1", ImageSpec([layer(busybox_layer().bytes())]))
    s = replace(worker_settings, insecure_registries=(registry.host,))
    async with running(Engine(s, make_driver("process", s))) as engine:
        try:
            async with TestClient(TestServer(make_app(engine))) as c:
                yield c
        finally:
            await destroy_all(engine)


async def test_exec_runs_inside_a_user_namespaced_container(
    api: Client, registry: Registry
) -> None:
    config = {"image": f"{registry.host}/box:1", "init": {"exec": ["sleep", "600"]}}
    made = await api.post("/v1/machines", json={"app": "execd", "config": config})
    assert made.status == 201, await made.text()
    mid = (await made.json())["id"]
    waited = await api.get(f"/v1/machines/{mid}/wait", params={"state": "started"})
    assert waited.status == 200, await waited.text()

    script = "id -u; cat /proc/self/uid_map; cat /proc/net/dev | wc -l; echo $SOUK_MACHINE_ID"
    ran = await api.post(f"/v1/machines/{mid}/exec", json={"command": ["sh", "-c", script]})
    assert ran.status == 200, await ran.text()
    result = await ran.json()
    assert result["exit_code"] == 0, result
    uid, mapping, interfaces, machine_id = result["stdout"].splitlines()
    assert uid == "0"  # the container's root...
    inside, host, _ = mapping.split()
    assert inside == "0" and int(host) >= app_users.BASE  # ...which is the app's id on the host
    assert int(interfaces) == 4  # two header lines, lo and the machine's own interface
    assert machine_id == mid

"""`config.files` and app secrets in an image machine: written into its root filesystem before
it starts, owned by the container's root; secrets in its environment. And `souk dev` runs such
a machine from a plain-http registry it was told about, on a `performance` CPU."""

from __future__ import annotations

import base64
import os
import shutil
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from souk.dev import dev_cluster
from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.oci.registry import RegistryClient
from tests.support.engines import settings
from tests.support.images import ImageSpec, Layer, busybox_layer, layer
from tests.support.registry import Registry, push

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("runc") is None or os.geteuid() != 0, reason="needs root and runc"
    ),
]

SCRIPT = (
    'echo "$API_KEY|$MODE"; cat /etc/app/app.conf; cat /run/keys/tls.key;'
    " stat -c '%a %u' /run/keys/tls.key /etc/app/app.conf"
)


@pytest.fixture(scope="session")
def base() -> Layer:
    return layer(busybox_layer().file("etc/app/.keep", b"").bytes())


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_files_and_secrets_reach_an_image_machine(
    registry: Registry, client: RegistryClient, base: Layer, tmp_path: Path
) -> None:
    await push(client, registry, "files:1", ImageSpec([base], env=["PATH=/bin"]))
    s = replace(settings(tmp_path), insecure_registries=(registry.host,))
    config = MachineConfig.model_validate(
        {
            "image": f"{registry.host}/files:1",
            "init": {"exec": ["/bin/sh", "-c", SCRIPT]},
            "env": {"MODE": "prod"},
            "restart": {"policy": "no"},
            "files": [
                {"guest_path": "/etc/app/app.conf", "raw_value": b64(b"port=8080\n")},
                {"guest_path": "/run/keys/tls.key", "secret_name": "TLS_KEY"},
            ],
        }
    )
    secrets = {"API_KEY": "k-123", "TLS_KEY": b64(b"private\n")}
    async with running(Engine(s, make_driver("process", s))) as engine:
        create = CreateMachine(app="files", config=config, secrets=secrets)
        machine = await engine.create(create)
        ok, now = await engine.wait(machine.id, "stopped", 60, None)
        assert ok, (now.state, [e.model_dump() for e in engine.events(machine.id)])
        out = (s.rundir(machine.id) / "stdout.log").read_text().splitlines()
        assert out == ["k-123|prod", "port=8080", "private", "600 0", "644 0"]
        assert "k-123" not in engine.get(machine.id).model_dump_json()
        await engine.submit(machine.id, "destroy", {"force": True})
        assert (await engine.wait(machine.id, "destroyed", 30, None))[0]
        rows = engine.store.read.execute("SELECT * FROM machine_secrets").fetchall()
        assert rows == []  # a destroyed machine's secrets go with it


async def test_souk_dev_pulls_from_an_insecure_registry_onto_performance_cpus(
    registry: Registry, client: RegistryClient, base: Layer, tmp_path: Path
) -> None:
    await push(client, registry, "perf:1", ImageSpec([base], env=["PATH=/bin"]))
    config = {
        "image": f"{registry.host}/perf:1",
        "init": {"exec": ["/bin/sh", "-c", "echo ran"]},
        "guest": {"cpu_kind": "performance", "cpus": 1, "memory_mb": 64},
        "restart": {"policy": "no"},
    }
    dev = dev_cluster(tmp_path / "dev", port=0, proxy_port=0, insecure_registries=(registry.host,))
    async with dev as d, aiohttp.ClientSession() as http:
        auth = {"Authorization": f"Bearer {d.token}"}
        async with http.post(f"{d.api}/v1/apps", json={"name": "perf"}, headers=auth) as resp:
            assert resp.status == 201, await resp.text()
        machines = f"{d.api}/v1/apps/perf/machines"
        body = {"region": "mad", "config": config}
        async with http.post(machines, json=body, headers=auth) as resp:
            assert resp.status == 200, await resp.text()
            mid = (await resp.json())["id"]
        wait = f"{machines}/{mid}/wait"
        params = {"state": "stopped", "timeout": "60"}
        async with http.get(wait, params=params, headers=auth) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(f"{machines}/{mid}/events", headers=auth) as resp:
            events = await resp.json()
        assert not [e for e in events if (e["type"], e.get("step")) == ("start", "error")], events
        async with http.delete(f"{machines}/{mid}", headers=auth) as resp:
            assert resp.status == 200

"""Image machines through the whole worker: a real registry, real runc, the engine's operations
and its recovery after a crash."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from souk.catalog.bus import InProcessBus
from souk.catalog.replica import Replica
from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, publishing, running
from souk.worker.engine import Engine
from souk.worker.host import procfs
from souk.worker.oci import network
from souk.worker.oci.registry import RegistryClient
from tests.support.engines import destroy_all, settings
from tests.support.images import ImageSpec, Layer, busybox_layer, layer
from tests.support.registry import Registry, push
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("runc") is None or os.geteuid() != 0, reason="needs root and runc"
    ),
]


@pytest.fixture(scope="session")
def web_layer() -> Layer:
    return layer(busybox_layer().file("www/index.html", b"hello from an image\n").bytes())


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        for _ in range(250):
            try:
                async with http.get(url) as resp:
                    return await resp.text()
            except (aiohttp.ClientConnectionError, TimeoutError):
                await asyncio.sleep(0.02)
    raise AssertionError(f"nothing answered at {url}")


async def test_an_image_machine_serves_restarts_and_is_adopted(
    registry: Registry, client: RegistryClient, web_layer: Layer, tmp_path: Path
) -> None:
    spec = ImageSpec([web_layer], cmd=["httpd", "-f", "-p", "8080", "-h", "/www"])
    await push(client, registry, "web:1", spec)
    s = replace(settings(tmp_path), insecure_registries=(registry.host,))
    config = MachineConfig(image=f"{registry.host}/web:1", restart={"policy": "always"})  # type: ignore[arg-type]
    engine = Engine(s, make_driver("process", s))
    await engine.recover()
    machine = await engine.create(CreateMachine(app="web", config=config))
    ok, started = await engine.wait(machine.id, "started", 60, None)
    assert ok, started.state
    assert machine.private_ip and ipaddress.ip_address(machine.private_ip).is_private
    url = f"http://[{machine.private_ip}]:8080/index.html"
    assert await get_text(url) == "hello from an image\n"
    assert engine.drivers.image_cached(config.image)
    logged = engine.store.read.execute("SELECT ref FROM images").fetchall()
    assert [row["ref"] for row in logged] == [config.image]  # what the catalog will replicate
    pid = engine.store.read.execute(
        "SELECT pid FROM machines WHERE id = ?", (machine.id,)
    ).fetchone()[0]
    await engine.close()  # the worker dies; its container lives on

    async with running(Engine(s, make_driver("process", s))) as again:
        ok, _ = await again.wait(machine.id, "started", 5, None)
        assert ok and await get_text(url) == "hello from an image\n"
        os.kill(pid, signal.SIGKILL)  # the container's process dies: policy `always`
        for _ in range(300):
            if again.get(machine.id, events=False).restart_count == 1:
                break
            await asyncio.sleep(0.02)
        assert (await again.wait(machine.id, "started", 30, None))[0]
        assert await get_text(url) == "hello from an image\n"
        row = again.store.read.execute(
            "SELECT pid, pid_start FROM machines WHERE id = ?", (machine.id,)
        ).fetchone()
        assert row["pid"] != pid and procfs.is_alive(row["pid"], row["pid_start"])
        await again.submit(machine.id, "destroy", {"force": True})
        assert (await again.wait(machine.id, "destroyed", 30, None))[0]
        assert not procfs.is_alive(row["pid"], row["pid_start"])  # nothing left running


async def test_a_worker_without_an_image_registry_refuses_cleanly(tmp_path: Path) -> None:
    s = settings(tmp_path)
    async with running(Engine(s, make_driver("process", s))) as engine:
        config = MachineConfig(image="127.0.0.1:1/nothing:here")
        machine = await engine.create(CreateMachine(app="web", config=config))
        ok, failed = await engine.wait(machine.id, "failed", 30, None)
        assert ok, failed.state
        errors = [e for e in engine.events(machine.id) if (e.type, e.step) == ("start", "error")]
        assert errors
        # A failed machine keeps what its start made (its network) until it is destroyed.
        netns, _ = network.names(machine.id)
        assert (network.NETNS_DIR / netns).exists()
        await destroy_all(engine)
        assert not (network.NETNS_DIR / netns).exists()


async def test_the_catalog_learns_which_images_a_worker_caches(
    registry: Registry, client: RegistryClient, web_layer: Layer, tmp_path: Path
) -> None:
    spec = ImageSpec([web_layer], cmd=["httpd", "-f", "-p", "8080", "-h", "/www"])
    await push(client, registry, "cached:1", spec)
    s = replace(settings(tmp_path), insecure_registries=(registry.host,))
    image = f"{registry.host}/cached:1"
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    async with (
        running(Engine(s, make_driver("process", s))) as engine,
        publishing(engine, bus, "http://w1.test"),
    ):

        def holders(name: str) -> list[str]:
            return [w.id for w in replica.placeable_holding(s.region, name)]

        assert holders(image) == []
        machine = await engine.create(CreateMachine(app="web", config=MachineConfig(image=image)))
        assert (await engine.wait(machine.id, "started", 60, None))[0]
        for _ in range(200):
            if holders(image):
                break
            await asyncio.sleep(0.01)
        assert holders(image) == ["w1"]  # placement's cached-image bonus sees it
        digest = engine.store.read.execute("SELECT digest FROM images").fetchone()[0]
        assert holders(digest) == ["w1"]
        await engine.submit(machine.id, "destroy", {"force": True})
        assert (await engine.wait(machine.id, "destroyed", 30, None))[0]
    await replica.stop()


def served(text: str) -> ImageSpec:
    page = layer(busybox_layer().file("www/index.html", text.encode()).bytes())
    return ImageSpec([page], cmd=["httpd", "-f", "-p", "8080", "-h", "/www"])


def started_with(engine: Engine, machine_id: str) -> list[str]:
    """The image digest each start of the machine ran, oldest first."""
    spawns = [e for e in engine.events(machine_id) if e.step == "spawn"]
    return [e.request["image"] for e in reversed(spawns)]


async def test_a_version_runs_the_image_its_first_start_found_until_it_is_updated(
    registry: Registry, client: RegistryClient, tmp_path: Path
) -> None:
    """Its tag moved meanwhile, a stopped machine starts again on the image it ran (no lookup
    at the registry); an update, a new version, looks the tag up again."""
    first = await push(client, registry, "moving:1", served("first\n"))
    s = replace(settings(tmp_path), insecure_registries=(registry.host,))
    config = MachineConfig(image=f"{registry.host}/moving:1")
    async with running(Engine(s, make_driver("process", s))) as engine:
        try:
            machine = await engine.create(CreateMachine(app="web", config=config))
            assert (await engine.wait(machine.id, "started", 60, None))[0]
            url = f"http://[{machine.private_ip}]:8080/index.html"
            assert await get_text(url) == "first\n"
            moved = await push(client, registry, "moving:1", served("moved\n"))
            assert moved.digest != first.digest
            await engine.submit(machine.id, "stop")
            assert (await engine.wait(machine.id, "stopped", 30, None))[0]
            await engine.submit(machine.id, "start")
            assert (await engine.wait(machine.id, "started", 30, None))[0]
            assert await get_text(url) == "first\n"
            assert started_with(engine, machine.id) == [first.digest, first.digest]
            assert engine.get(machine.id).image_digest == first.digest  # what the API shows
            await engine.update(machine.id, config)  # a new version, however alike
            await eventually(lambda: len(started_with(engine, machine.id)) == 3)
            assert (await engine.wait(machine.id, "started", 30, None))[0]
            assert await get_text(url) == "moved\n"
            assert started_with(engine, machine.id) == [first.digest, first.digest, moved.digest]
            assert engine.get(machine.id).image_digest == moved.digest
        finally:
            await destroy_all(engine)
        pins = engine.store.read.execute("SELECT * FROM image_pins").fetchall()
        assert pins == []  # a destroyed machine starts no version again

"""The runc driver: real containers from images pushed to a real registry."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from souk.models.machine import InitConfig, MachineConfig
from souk.worker.drivers.base import ExecTimeout
from souk.worker.drivers.runc import RuncDriver
from souk.worker.host import procfs
from souk.worker.oci.registry import RegistryClient
from tests.support.images import ImageSpec, Layer, busybox_layer, layer
from tests.support.registry import Registry, push
from tests.worker.oci.conftest import launch

pytestmark = pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed")


@pytest.fixture(scope="session")
def web_layer() -> Layer:
    return layer(busybox_layer().file("www/index.html", b"hello from a container\n").bytes())


async def test_http_service_on_private_address_and_adoption(
    registry: Registry, client: RegistryClient, web_layer: Layer, driver: RuncDriver, tmp_path: Path
) -> None:
    spec = ImageSpec([web_layer], cmd=["httpd", "-f", "-p", "8080", "-h", "/www"], workdir="/www")
    await push(client, registry, "web:1", spec)
    config = MachineConfig(image=f"{registry.host}/web:1", env={"WHO": "machine"})
    machine = launch(tmp_path, config, "10.213.7.2")
    await driver.prepare(machine)
    handle = await driver.spawn(machine)
    try:
        assert await driver.spawn(machine) == handle  # idempotent: the same container
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            for _ in range(200):
                try:
                    async with http.get("http://10.213.7.2:8080/index.html") as resp:
                        assert resp.status == 200
                        assert await resp.text() == "hello from a container\n"
                        break
                except (aiohttp.ClientConnectionError, TimeoutError):
                    await asyncio.sleep(0.02)
            else:
                raise AssertionError("httpd never answered on the private address")

        # A restarted worker (a new driver on the same state) adopts it, and can stop it.
        again = RuncDriver(driver.images, driver.state_dir, driver.cgroup_parent)
        assert again.adopt(machine.machine_id, "not-this-spawn", handle) is None
        adopted = again.adopt(machine.machine_id, machine.marker, handle)
        assert adopted == handle
        await again.stop(machine.machine_id, adopted, "SIGTERM", 5.0)
        assert not procfs.is_alive(handle.pid, handle.pid_start)
        assert await again.wait(machine.machine_id) is not None
    finally:
        await driver.cleanup(machine)


async def test_exit_code_env_and_limits(
    registry: Registry,
    client: RegistryClient,
    busybox_base: Layer,
    driver: RuncDriver,
    tmp_path: Path,
) -> None:
    await push(client, registry, "bb:1", ImageSpec([busybox_base], env=["PATH=/bin", "FROM=image"]))
    script = (
        "echo $FROM $WHO $SOUK_PRIVATE_IP; hostname; id -u;"
        " cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null; exit 3"
    )
    config = MachineConfig(
        image=f"{registry.host}/bb:1",
        env={"WHO": "machine"},
        init=InitConfig(exec=["/bin/sh", "-c", script]),
        guest={"memory_mb": 64},
    )
    machine = launch(tmp_path, config, "10.213.7.3")
    await driver.prepare(machine)
    try:
        await driver.spawn(machine)
        assert await driver.wait(machine.machine_id) == 3
        lines = (machine.rundir / "stdout.log").read_text().splitlines()
        assert lines[:3] == ["image machine 10.213.7.3", machine.machine_id, "0"]
    finally:
        await driver.cleanup(machine)
    assert not (machine.rundir / "image" / "rootfs").exists()


async def test_exec_ps_pause_and_resume_in_a_container(
    registry: Registry,
    client: RegistryClient,
    busybox_base: Layer,
    driver: RuncDriver,
    tmp_path: Path,
) -> None:
    await push(client, registry, "bb:2", ImageSpec([busybox_base], env=["PATH=/bin"]))
    config = MachineConfig(
        image=f"{registry.host}/bb:2",
        env={"WHO": "machine"},
        init=InitConfig(exec=["/bin/sleep", "600"]),
    )
    machine = launch(tmp_path, config, "10.213.7.4")
    await driver.prepare(machine)
    handle = await driver.spawn(machine)
    mid = machine.machine_id
    try:
        # exec: the container's env, hostname (UTS namespace), root, and pid namespace
        script = "echo $WHO; hostname; id -u; tr '\\0' ' ' < /proc/1/cmdline; echo; exit 4"
        out = await driver.exec(machine, handle, ["/bin/sh", "-c", script], b"", 10)
        assert out.exit_code == 4
        # PID 1 is souk-init, which runs the machine's command
        assert out.stdout.decode().splitlines() == ["machine", mid, "0", "/.souk/init --container "]
        piped = await driver.exec(machine, handle, ["/bin/cat"], b"from stdin", 10)
        assert piped.stdout == b"from stdin"
        with pytest.raises(ExecTimeout):
            await driver.exec(machine, handle, ["/bin/sleep", "30"], b"", 1)
        pids = await driver.processes(mid, handle)  # the timed-out one is gone
        assert sorted(procfs.arguments(pid) or [] for pid in pids) == [
            [b"/.souk/init", b"--container"],
            [b"/bin/sleep", b"600"],
        ]

        # frozen through the container's freezer group where the host has one: runc reads
        # its state back from there
        assert driver.freezer.can_freeze(mid) == (driver.freezer.freezer != "none")
        await driver.freeze(mid, handle)
        state = await driver.state(mid)
        assert state is not None and state["status"] == "paused"
        await driver.freeze(mid, handle)  # idempotent
        await driver.thaw(mid, handle)
        state = await driver.state(mid)
        assert state is not None and state["status"] == "running"
        # a paused container still stops: the driver resumes it first
        await driver.freeze(mid, handle)
        await driver.stop(mid, handle, "SIGKILL", 5.0)
        assert not procfs.is_alive(handle.pid, handle.pid_start)
    finally:
        await driver.cleanup(machine)


async def test_a_tag_that_moved_starts_the_image_it_names_now(
    registry: Registry, client: RegistryClient, driver: RuncDriver, tmp_path: Path
) -> None:
    """A cached image's tag is looked up at the registry by every start given no digest (a
    version's first): once it has moved, the next such start runs the image it names now, and
    the first image's pin went with its machine."""
    reference = f"{registry.host}/moving:1"
    config = MachineConfig(image=reference, init=InitConfig(exec=["/bin/cat", "/which"]))

    async def run(which: bytes, ip: str) -> tuple[str, str]:
        base = busybox_layer().file("which", which).bytes()
        await push(client, registry, "moving:1", ImageSpec([layer(base)]))
        machine = launch(tmp_path, config, ip)
        await driver.prepare(machine)
        try:
            await driver.spawn(machine)
            assert await driver.wait(machine.machine_id) == 0
            record = driver.images.store.find(reference)
            assert record is not None
            return (machine.rundir / "stdout.log").read_text(), record.digest
        finally:
            await driver.cleanup(machine)

    first, first_digest = await run(b"first\n", "10.213.7.9")
    second, second_digest = await run(b"second\n", "10.213.7.10")
    assert (first, second) == ("first\n", "second\n")
    assert first_digest != second_digest
    assert not driver.images.store.pinned()


async def test_a_start_resumed_after_a_crash_runs_what_its_first_try_prepared(
    registry: Registry, client: RegistryClient, driver: RuncDriver, tmp_path: Path
) -> None:
    """The tag moved while the worker was down: the same start (its marker) takes up the image it
    prepared, which may be running already, not the one the tag names now; another start asks."""

    def which(text: bytes) -> ImageSpec:
        return ImageSpec([layer(busybox_layer().file("which", text).bytes())])

    first = await push(client, registry, "resumed:1", which(b"first\n"))
    config = MachineConfig(image=f"{registry.host}/resumed:1", init=InitConfig(exec=["/bin/true"]))
    machine = launch(tmp_path, config, "10.213.7.11")
    try:
        assert await driver.prepare(machine) == first.digest
        moved = await push(client, registry, "resumed:1", which(b"moved\n"))
        assert await driver.prepare(replace(machine, resumed=True)) == first.digest
        fresh = replace(machine, resumed=False)  # this worker run's own start: nothing to resume
        assert await driver.prepare(fresh) == moved.digest
        another = replace(machine, marker=uuid.uuid4().hex)
        assert await driver.prepare(another) == moved.digest
    finally:
        await driver.cleanup(machine)


async def test_a_container_on_the_private_network_asks_its_workers_resolver(
    registry: Registry,
    client: RegistryClient,
    busybox_base: Layer,
    driver: RuncDriver,
    tmp_path: Path,
) -> None:
    await push(client, registry, "bb:6pn", ImageSpec([busybox_base], env=["PATH=/bin"]))
    script = "cat /etc/resolv.conf; cat /proc/net/if_inet6"
    config = MachineConfig(
        image=f"{registry.host}/bb:6pn", init=InitConfig(exec=["/bin/sh", "-c", script])
    )
    address = "fd73:6f75:6b00:5eef:7400:1:0:9"
    machine = launch(tmp_path, config, address)
    await driver.prepare(machine)
    try:
        await driver.spawn(machine)
        assert await driver.wait(machine.machine_id) == 0
        out = (machine.rundir / "stdout.log").read_text()
        assert "nameserver fd73:6f75:6b00::3" in out
        assert "fd736f756b005eef7400000100000009" in out and "eth0" in out
    finally:
        await driver.cleanup(machine)

"""Image machines as qemu guests: skipped, with the reason, where the host cannot boot one
(setup.sh installs what they need). Guests run under TCG here: each module boots one or two and
its tests share them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from souk.worker.drivers import vm_boot
from souk.worker.settings import WorkerSettings
from tests.support.engines import settings
from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.registry import Registry, push, registry_or_skip


def missing() -> str | None:
    """Why this host runs no guest; None: it does."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, cgroups)"
    if shutil.which(vm_boot.QEMU) is None:
        return "qemu-system-x86 is not installed (scripts/setup.sh installs it)"
    if vm_boot.find_kernel() is None:
        return "no kernel under /boot (scripts/setup.sh installs linux-image-cloud-amd64)"
    if vm_boot.find_init() is None:
        return "souk-init is not built (scripts/setup.sh builds it)"
    if shutil.which("mkfs.ext4") is None or shutil.which("qemu-img") is None:
        return "mkfs.ext4 and qemu-img are needed"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    why = missing()
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.vm)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="module")
def vm_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with registry_or_skip(tmp_path_factory.mktemp("registry")) as found:
        yield found


@pytest.fixture(scope="module")
def vm_settings(tmp_path_factory: pytest.TempPathFactory, vm_registry: Registry) -> WorkerSettings:
    root = tmp_path_factory.mktemp("vm")
    return replace(settings(root), insecure_registries=(vm_registry.host,))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def busybox_image(vm_registry: Registry) -> str:
    """A busybox image in the registry: its reference."""
    tar = busybox_layer().file("www/index.html", b"hello from a guest\n")
    for applet in ("uname", "ps", "hostname", "kill"):
        tar.symlink(f"bin/{applet}", "busybox")
    spec = ImageSpec([layer(tar.bytes())], cmd=["sh", "-c", "sleep 3600"])
    async with vm_registry.client() as client:
        await push(client, vm_registry, "guest:1", spec)
    return f"{vm_registry.host}/guest:1"

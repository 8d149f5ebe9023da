"""The image code's fixtures: a real registry on loopback, clients and caches reaching it, and
a busybox base layer built by our own code."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from souk.models.machine import MachineConfig
from souk.worker.drivers.base import Launch
from souk.worker.drivers.runc import RuncDriver
from souk.worker.oci.auth import Credentials
from souk.worker.oci.images import ImageCache
from souk.worker.oci.registry import RegistryClient
from tests.support.images import Layer, busybox_layer, layer
from tests.support.registry import Registry, image_caches, registry_or_skip


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with registry_or_skip(tmp_path / "registry") as found:
        yield found


@pytest.fixture
def basic_registry(tmp_path: Path) -> Iterator[Registry]:
    """A registry behind htpasswd (HTTP Basic) auth."""
    with registry_or_skip(tmp_path / "basic-registry", Credentials("alice", "s3cret")) as found:
        yield found


@pytest.fixture(scope="session")
def busybox_base() -> Layer:
    if shutil.which("busybox") is None:
        pytest.skip("busybox is not installed")
    return layer(busybox_layer().bytes())


@pytest.fixture
async def client(registry: Registry) -> AsyncIterator[RegistryClient]:
    async with registry.client() as c:
        yield c


@pytest.fixture
async def make_cache(
    registry: Registry, tmp_path: Path
) -> AsyncIterator[Callable[..., ImageCache]]:
    """ImageCaches on their own directories, all reaching the test registry; closed after."""
    async with image_caches(registry, tmp_path) as make:
        yield make


@pytest.fixture
async def driver(
    make_cache: Callable[..., ImageCache], tmp_path: Path
) -> AsyncIterator[RuncDriver]:
    parent = f"souk-test-{uuid.uuid4().hex[:6]}"
    yield RuncDriver(make_cache(), tmp_path / "runc", cgroup_parent=parent)
    for made in Path("/sys/fs/cgroup").glob(f"*/{parent}"):  # runc made it, empty by now
        for child in made.iterdir():
            if child.is_dir():
                child.rmdir()
        made.rmdir()


def launch(tmp_path: Path, config: MachineConfig, ip: str) -> Launch:
    machine_id = uuid.uuid4().hex[:12]
    rundir = tmp_path / "machines" / machine_id
    rundir.mkdir(parents=True)
    return Launch(machine_id, "app", "mad", "i1", config, uuid.uuid4().hex, rundir, ip)

"""Volumes on real loop devices and ext4: these tests need root, losetup and e2fsprogs."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.worker.daemon import make_app, make_driver, running
from souk.worker.engine import Engine
from souk.worker.volumes import disk as volume_disk
from tests.support.clients import Client
from tests.support.engines import settings
from tests.support.volumes import sweep

_REFUSED = volume_disk.unsupported_reason()
needs_loop = pytest.mark.skipif(
    _REFUSED is not None, reason=f"volumes need loop devices: {_REFUSED}"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(needs_loop)


def leftovers(data_dir: Path) -> dict[str, list[str]]:
    """Loop devices, mounts and volume files under `data_dir`: what a clean worker has none of
    (but the shared mount of its volumes' directory, which it keeps)."""
    root = str(data_dir.resolve())
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    shared = str(volume_disk.volumes_dir(data_dir.resolve()))
    mounts = [m for m in volume_disk.mount_points() if m.startswith(root) and m != shared]
    kept = volume_disk.volumes_dir(data_dir)
    files = sorted(str(p) for p in kept.rglob("*")) if kept.exists() else []
    return {
        "loops": [line for line in loops.splitlines() if root in line],
        "mounts": mounts,
        "files": files,
    }


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "w1"
    sweep(tmp_path / "w1")


@pytest.fixture
async def vengine(tmp_path: Path, data_dir: Path) -> AsyncIterator[Engine]:
    s = settings(tmp_path, disk_mb=256)
    async with running(Engine(s, make_driver("process", s))) as e:
        yield e


@pytest.fixture
async def vclient(vengine: Engine) -> AsyncIterator[Client]:
    async with TestClient(TestServer(make_app(vengine))) as c:
        yield c


@pytest.fixture
async def plain_client(tmp_path: Path, data_dir: Path) -> AsyncIterator[Client]:
    """A worker started without --disk-mb."""
    s = settings(tmp_path)
    async with (
        running(Engine(s, make_driver("process", s))) as e,
        TestClient(TestServer(make_app(e))) as c,
    ):
        yield c

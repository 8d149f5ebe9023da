"""An image machine (runc) with a volume bind-mounted: root inside writes there, and the volume's
size holds inside the container."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from souk.models.machine import CreateMachine, MachineConfig
from souk.models.volume import CreateVolume
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.volumes import disk as volume_disk
from tests.support.engines import settings
from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.registry import Registry, push, registry_or_skip

pytestmark = pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed")

SCRIPT = """
echo "$1" > /data/note
if busybox dd if=/dev/zero of=/data/big bs=1048576 count=40 2>/dev/null; then
  echo fits > /data/verdict
else
  echo full > /data/verdict
fi
busybox rm -f /data/big
exec sleep 600
"""


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with registry_or_skip(tmp_path / "registry") as found:
        yield found


async def until_text(path: Path) -> str:
    for _ in range(750):
        if path.exists() and path.read_text():
            return path.read_text()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never written")


async def test_a_container_writes_its_bind_mounted_volume_up_to_its_size(
    registry: Registry, tmp_path: Path, data_dir: Path
) -> None:
    async with registry.client() as client:
        spec = ImageSpec([layer(busybox_layer().bytes())], cmd=["sh", "-c", SCRIPT, "sh", "one"])
        await push(client, registry, "writer:1", spec)
    s = replace(settings(tmp_path, disk_mb=64), insecure_registries=(registry.host,))
    async with running(Engine(s, make_driver("process", s))) as engine:
        await engine.create_volume(CreateVolume(app="box", id="vol_aaaaaa1", name="d", size_mb=16))
        config = MachineConfig.model_validate(
            {
                "image": f"{registry.host}/writer:1",
                "mounts": [{"volume": "vol_aaaaaa1", "path": "/data"}],
                "restart": {"policy": "no"},
            }
        )
        m = await engine.create(CreateMachine(app="box", config=config))
        mnt = volume_disk.paths(s.data_dir, "vol_aaaaaa1").mountpoint
        try:
            assert await until_text(mnt / "verdict") == "full\n"
            assert (mnt / "note").read_text() == "one\n"
            (app_uid,) = engine.store.read.execute(
                "SELECT uid FROM app_users WHERE app = 'box'"
            ).fetchone()
            assert (mnt / "note").stat().st_uid == app_uid  # root inside, the app's id outside
        finally:
            await engine.submit(m.id, "destroy", {"force": True})
            await engine.wait(m.id, "destroyed", 15, None)
        await engine.destroy_volume("vol_aaaaaa1")

"""A volume attached to a vm machine is a virtio disk of its guest, mounted by its init at the
mount's path; the host lends it (its own mount swapped for a placeholder) while the guest runs,
and mounts it again once qemu is gone. Its data outlives the machine: a new machine mounting
it reads what the first wrote, and a worker restarted meanwhile never mounts it twice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from souk.models.machine import CreateMachine, MachineConfig
from souk.models.machine_ops import ExecRequest
from souk.models.volume import CreateVolume
from souk.worker.daemon import make_driver, running
from souk.worker.drivers import vm_volumes
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings
from souk.worker.volumes import disk as volume_disk
from souk.worker.volumes.operations import VolumeFailed
from tests.support.volumes import sweep

_REFUSED = volume_disk.unsupported_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(900),
    pytest.mark.skipif(_REFUSED is not None, reason=f"volumes need loop devices: {_REFUSED}"),
]
VOLUME = "vol_vmdisk01"


async def machine_with_volume(engine: Engine, image: str) -> str:
    config = MachineConfig.model_validate(
        {
            "image": image,
            "guest": {"cpus": 1, "memory_mb": 256},
            "mounts": [{"volume": VOLUME, "path": "/data"}],
            "restart": {"policy": "no"},
        }
    )
    m = await engine.create(CreateMachine(app="keeper", config=config))
    ok, found = await engine.wait(m.id, "started", 400, None)
    assert ok, (found.state, (engine.settings.rundir(m.id) / "console.log").read_text())
    return m.id


async def run(engine: Engine, machine_id: str, script: str) -> tuple[int, str]:
    out = await engine.exec(machine_id, ExecRequest(command=["sh", "-c", script], timeout=60))
    return out.exit_code, out.stdout + out.stderr


async def destroy(engine: Engine, machine_id: str) -> None:
    await engine.submit(machine_id, "destroy", {"force": True})
    assert (await engine.wait(machine_id, "destroyed", 60, None))[0]


async def test_a_volumes_data_outlives_its_vm_machine(
    vm_settings: WorkerSettings, busybox_image: str
) -> None:
    s = replace(vm_settings, disk_mb=64)
    p = volume_disk.paths(s.data_dir, VOLUME)
    try:
        async with running(Engine(s, make_driver("vm", s))) as engine:
            await engine.create_volume(CreateVolume(app="keeper", id=VOLUME, name="d", size_mb=16))
            first = await machine_with_volume(engine, busybox_image)
            code, out = await run(engine, first, "cat /proc/mounts; echo kept > /data/note")
            assert code == 0, out
            assert " /data ext4 " in out  # the guest's own disk, not a host directory
        # the worker dies and comes back: it mounts every volume it finds unmounted, and must
        # find this one in use, not mount it a second time
        async with running(Engine(s, make_driver("vm", s))) as engine:
            assert (await engine.wait(first, "started", 30, None))[0]
            assert vm_volumes.lent(p)  # the host's mount stands aside while the guest runs...
            assert not (p.mountpoint / "note").exists()
            assert await run(engine, first, "cat /data/note") == (0, "kept\n")
            with pytest.raises(VolumeFailed, match="freeze"):  # no copy of a disk in use
                await engine.snapshot_volume(VOLUME)
            with pytest.raises(VolumeFailed, match="e2fsck"):  # nor its file system grown
                await engine.extend_volume(VOLUME, 32)
            assert await run(engine, first, "cat /data/note") == (0, "kept\n")
            await destroy(engine, first)
            assert not vm_volumes.lent(p)  # ...and the volume is the host's again after it
            assert (p.mountpoint / "note").read_text() == "kept\n"
            await engine.snapshot_volume(VOLUME)  # the host's again: it snapshots as any

            second = await machine_with_volume(engine, busybox_image)
            assert await run(engine, second, "cat /data/note") == (0, "kept\n")
            # written to the guest's page cache, then suspended (its memory on disk, not in
            # the host's) and stopped: the stop brings the memory back and the guest syncs
            assert (await run(engine, second, "echo again > /data/more"))[0] == 0
            await engine.submit(second, "suspend", {})
            assert (await engine.wait(second, "suspended", 120, None))[0]
            await engine.submit(second, "stop", {})
            assert (await engine.wait(second, "stopped", 120, None))[0]
            assert not vm_volumes.lent(p)
            assert (p.mountpoint / "more").read_text() == "again\n"
            await destroy(engine, second)
            await engine.destroy_volume(VOLUME)
    finally:
        sweep(s.data_dir)

"""`souk dev` offers disk to volumes (as root where loop devices work), so the quick start's
volumes can be tried there; at its end every volume is unmounted and let go, leaving files
only, which the next run mounts again."""

from __future__ import annotations

from pathlib import Path

from souk.clients.machines import MachinesClient
from souk.dev import dev_cluster
from souk.models.api import CreateAppRequest, CreateMachineRequest
from souk.models.machine import InitConfig, MachineConfig, Mount
from souk.models.volume import CreateVolumeRequest
from souk.worker.volumes import disk as volume_disk
from tests.support.volumes import sweep
from tests.worker.volumes.conftest import leftovers


async def test_souk_dev_offers_volumes_and_lets_them_go_at_its_end(tmp_path: Path) -> None:
    data = tmp_path / "dev"
    workers = [data / "workers" / f"{r}{n}" for r in ("mad", "ams", "sin") for n in (1, 2)]
    try:
        async with dev_cluster(data, port=0, proxy_port=0, disk_mb=64) as d:
            api = MachinesClient(d.api, d.token)
            try:
                await api.create_app(CreateAppRequest(name="keeps"))
                req = CreateVolumeRequest(name="data", region="mad", size_mb=16)
                volume = await api.create_volume("keeps", req)
                config = MachineConfig(
                    init=InitConfig(exec=["sleep", "600"]),
                    mounts=[Mount(volume=volume.id, path="/data")],
                )
                m = await api.create("keeps", CreateMachineRequest(region="mad", config=config))
                assert await api.wait("keeps", m.id, "started", 30)
                assert m.worker == volume.zone  # on the volume's worker
            finally:
                for found in await api.machines("keeps"):
                    await api.destroy("keeps", found.id, force=True)
                    await api.wait("keeps", found.id, "destroyed", 30)
                await api.close()
        for folder in workers:
            left = leftovers(folder)
            assert left["loops"] == [] and left["mounts"] == [], (folder, left)
            assert not volume_disk.is_mounted(volume_disk.volumes_dir(folder.resolve()))
        assert any((folder / "volumes").glob("vol_*") for folder in workers)  # its files stay
    finally:
        for folder in workers:
            sweep(folder)

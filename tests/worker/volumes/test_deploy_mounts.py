"""`souk deploy` with [mounts]: a volume per primary, each on its own worker, kept through
updates (the machine stays on its volume's worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from souk.cli.command import CommandError
from souk.cli.deploy.config import loads
from souk.cli.deploy.progress import Progress
from souk.cli.deploy.run import deploy
from souk.clients.machines import MachinesClient
from souk.models.wire import RELEASE_KEY
from tests.support.broker_cluster import WorkerSpec, cluster
from tests.support.volumes import sweep

TOML = """
app = "stateful"
command = ["sleep", "600"]
regions = {{ mad = 2 }}
env = {{ RELEASE = "{release}" }}
[guest]
cpus = 1
memory_mb = 256
[deploy]
settle = "0s"
[mounts]
source = "data"
destination = "/data"
initial_size_mb = 16
"""


def test_mounts_need_an_in_place_strategy() -> None:
    text = TOML.format(release=1).replace('settle = "0s"', 'settle = "0s"\nstrategy = "canary"')
    with pytest.raises(CommandError, match="rolling or immediate"):
        loads(text)
    assert loads(TOML.format(release=1)).standbys is False


async def test_deploy_makes_a_volume_per_primary_and_keeps_the_pairing(tmp_path: Path) -> None:
    specs = [WorkerSpec(f"m{i}", "mad", disk_mb=64) for i in (1, 2, 3)]
    try:
        async with cluster(tmp_path, specs) as c:
            url = str(c.broker.make_url("")).rstrip("/")
            async with MachinesClient(url, c.tokens["admin"]) as api:
                await deploy(api, loads(TOML.format(release=1)), Progress(quiet=True))
                first = {m.id: m for m in await api.machines("stateful")}
                volumes = {v.id: v for v in await api.volumes("stateful")}
                assert len(first) == 2 and len(volumes) == 2  # no standbys: they cannot share
                pairs = {m.config.mounts[0].volume: m.worker for m in first.values()}
                assert set(pairs) == set(volumes)
                assert all(volumes[v].zone == w for v, w in pairs.items())
                assert len(set(pairs.values())) == 2  # apart: require_unique_zone
                assert all(v.attached_machine_id in first for v in volumes.values())
                # a new release updates in place: same machines, same volumes, same workers
                await deploy(api, loads(TOML.format(release=2)), Progress(quiet=True))
                second = {m.id: m for m in await api.machines("stateful")}
                assert set(second) == set(first)
                assert all(m.config.metadata[RELEASE_KEY] == "2" for m in second.values())
                assert {m.config.mounts[0].volume: m.worker for m in second.values()} == pairs
                assert {v.id for v in await api.volumes("stateful")} == set(volumes)
                # back to the first config (what `souk rollback` deploys): still the same pairs
                await deploy(api, loads(TOML.format(release=1)), Progress(quiet=True))
                third = await api.machines("stateful")
                assert {m.config.mounts[0].volume: m.worker for m in third} == pairs
                assert all(m.config.metadata[RELEASE_KEY] == "3" for m in third)
    finally:
        for i in (1, 2, 3):
            sweep(tmp_path / f"m{i}")

"""A deploy of an image app pins its tag once (`souk.cli.deploy.images`), through a whole cluster:
a real registry, the broker asking a worker, real runc."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

from souk.cli.deploy.config import parse
from souk.cli.deploy.errors import DeployError
from souk.cli.deploy.progress import Progress
from souk.cli.deploy.releases import AppRecord
from souk.cli.deploy.run import deploy
from souk.clients.machines import MachinesApiError, MachinesClient
from souk.dev import dev_cluster
from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.registry import REGISTRY, push, running_registry
from tests.worker.oci.machines.test_image_machines import get_text

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("runc") is None or os.geteuid() != 0, reason="needs root and runc"
    ),
    pytest.mark.skipif(REGISTRY is None, reason="docker-registry is not installed"),
]


def served(text: str) -> ImageSpec:
    page = layer(busybox_layer().file("www/index.html", text.encode()).bytes())
    return ImageSpec([page], cmd=["httpd", "-f", "-p", "8080", "-h", "/www"])


async def test_a_deploy_pins_its_tag_a_pushed_tag_updates_and_a_rollback_runs_the_old_image(
    tmp_path: Path,
) -> None:
    outage = contextlib.ExitStack()
    registry = outage.enter_context(running_registry(tmp_path / "registry"))
    client = registry.client()
    first = await push(client, registry, "site:1", served("first\n"))
    name = f"{registry.host}/site:1"
    toml = {
        "app": "site",
        "image": name,
        "regions": {"mad": 1},
        "deploy": {"standbys": False, "settle": 0},
    }
    dev = dev_cluster(tmp_path / "dev", port=0, proxy_port=0, insecure_registries=(registry.host,))
    async with dev as d:
        api = MachinesClient(d.api, d.token)

        async def page() -> str:
            [m] = await api.machines("site")
            return await get_text(f"http://[{m.private_ip}]:8080/index.html")

        try:
            with pytest.raises(DeployError, match="image_not_found"):
                await deploy(
                    api, parse({**toml, "image": f"{registry.host}/site:2"}), Progress(quiet=True)
                )
            assert not await api.app_exists("site")  # nothing made for an image not there
            await api.ensure_app("site")
            with pytest.raises(MachinesApiError) as bad:
                await api.pin_image("site", "Not A Reference!", "mad")
            assert (bad.value.http_status, bad.value.reason) == (400, "invalid_image")
            assert (await AppRecord.read(api, "site")).releases == []  # nor recorded

            await deploy(api, parse(toml), Progress(quiet=True))
            [m] = await api.machines("site")
            assert m.config.image == f"{name}@{first.digest}"
            assert await page() == "first\n"
            again = await deploy(api, parse(toml), Progress(quiet=True))
            assert again.plan["update"] == []  # the tag names what runs: nothing to do

            moved = await push(client, registry, "site:1", served("moved\n"))
            pushed = await deploy(api, parse(toml), Progress(quiet=True))
            assert pushed.plan["update"] == [m.id]  # the same souk.toml, a new image
            [m] = await api.machines("site")
            assert m.config.image == f"{name}@{moved.digest}"
            assert await page() == "moved\n"

            known = await AppRecord.read(api, "site")
            records = {r.version: r for r in known.releases}
            assert records[1].image == f"{name}@{first.digest}"
            assert records[3].image == f"{name}@{moved.digest}"
            assert records[3].config["image"] == name  # souk.toml as written
            back = parse({**known.deployable(records[1]), "app": "site"})
            await deploy(api, back, Progress(quiet=True), description="rollback to 1")
            [m] = await api.machines("site")
            assert m.config.image == f"{name}@{first.digest}"  # not what the tag names now
            assert await page() == "first\n"

            await deploy(api, parse(toml), Progress(quiet=True))  # forward again: the moved image
            await client.close()
            outage.close()  # the registry is gone: an env change still deploys
            progress = Progress(quiet=True)
            changed = await deploy(api, parse({**toml, "env": {"A": "1"}}), progress)
            assert changed.plan["update"] == [m.id]
            [m] = await api.machines("site")
            assert m.config.image == f"{name}@{moved.digest}"  # the current release's pin
            assert await page() == "moved\n"
            warnings = [e["warning"] for e in progress.events if "warning" in e]
            assert len(warnings) == 1 and f"keeping {name}@{moved.digest}" in warnings[0]
            with pytest.raises(DeployError, match="registry_unavailable"):
                await deploy(
                    api, parse({**toml, "image": f"{registry.host}/other:1"}), Progress(quiet=True)
                )
        finally:
            for m in await api.machines("site"):
                await api.destroy("site", m.id, force=True)
                await api.wait("site", m.id, "destroyed", 30)
            await api.close()
            await client.close()
            outage.close()

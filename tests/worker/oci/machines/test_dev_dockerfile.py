"""A user's first Dockerfile, as the README shows it: `souk deploy` in `examples/site`, below a
running `souk dev`, with no flag: the image is built from the base souk dev made, pushed to souk
dev's own registry, pulled by its worker and answered through its proxy."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import aiohttp
import pytest

from souk.clients.machines import MachinesClient
from souk.dev import dev_cluster
from souk.dev_images import REGISTRY_FILE, registry_program
from tests.support.worker_process import SOUK

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("runc") is None or os.geteuid() != 0, reason="needs root and runc"
    ),
    pytest.mark.skipif(registry_program() is None, reason="docker-registry is not installed"),
    pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah is not installed"),
    pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox is not installed"),
]

EXAMPLE = Path(__file__).parents[4] / "examples" / "site"


async def through_proxy(proxy: str, app: str) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for _ in range(100):
            async with http.get(proxy + "/", headers={"souk-app": app}) as resp:
                if resp.status == 200:
                    return await resp.text()
            await asyncio.sleep(0.1)
    raise AssertionError(f"{app} never answered through the proxy")


async def test_the_example_dockerfile_deploys_through_souk_dev(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(EXAMPLE, site)
    dev = dev_cluster(tmp_path / ".souk-dev", port=0, proxy_port=0, image_registry_port=0)
    async with dev as d:
        assert d.image_registry is not None
        assert (tmp_path / ".souk-dev" / REGISTRY_FILE).read_text().strip() == d.image_registry
        api = MachinesClient(d.api, d.token)
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("SOUK_")}
            proc = await asyncio.create_subprocess_exec(
                str(SOUK), "deploy", cwd=site, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(proc.communicate(), 240)
            assert proc.returncode == 0, out.decode()
            assert f"pushed {d.image_registry}/site:deploy-" in out.decode()
            [machine] = [m for m in await api.machines("site") if m.state == "started"]
            assert machine.config.image is not None
            assert machine.config.image.startswith(f"{d.image_registry}/site:deploy-")
            page = await through_proxy(d.proxy, "site")
            assert "hello from a Dockerfile" in page
        finally:
            for m in await api.machines("site"):
                await api.destroy("site", m.id, force=True)
                await api.wait("site", m.id, "destroyed", 30)
            await api.close()

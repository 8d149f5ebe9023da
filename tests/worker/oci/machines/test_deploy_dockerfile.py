"""`souk deploy` in a directory with a Dockerfile and a `[build]` section: the image is built
with buildah, pushed to a real registry, and deployed by its digest to real runc machines; the
release records the pinned image, and a failing build stops the deploy before anything is
made."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from souk.clients.machines import MachinesClient
from souk.dev import dev_cluster
from souk.network import hostport
from tests.support.registry import REGISTRY, running_registry
from tests.support.worker_process import SOUK
from tests.worker.oci.machines.test_image_machines import get_text

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("runc") is None or os.geteuid() != 0, reason="needs root and runc"
    ),
    pytest.mark.skipif(REGISTRY is None, reason="docker-registry is not installed"),
    pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah is not installed"),
    pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox is not installed"),
]

DOCKERFILE = """FROM scratch
COPY busybox /bin/busybox
COPY index.html /www/index.html
CMD ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]
"""


def project(folder: Path, registry: str, page: str) -> None:
    folder.mkdir(exist_ok=True)
    shutil.copy(str(shutil.which("busybox")), folder / "busybox")
    (folder / "index.html").write_text(page)
    (folder / "Dockerfile").write_text(DOCKERFILE)
    (folder / "souk.toml").write_text(
        'app = "built"\nregions = { mad = 1 }\n\n[build]\n'
        f'image = "{registry}/built"\ntls_verify = false\n\n'
        "[deploy]\nstandbys = false\nsettle = 0\n"
    )


async def souk_deploy(folder: Path, api: str, token: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(SOUK), "deploy", "--api", api, "--token", token,
        cwd=folder,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 180)
    return proc.returncode or 0, out.decode()


async def test_a_dockerfile_is_built_pushed_and_deployed_by_its_digest(tmp_path: Path) -> None:
    with running_registry(tmp_path / "registry") as registry:
        folder = tmp_path / "app"
        project(folder, registry.host, "built here\n")
        dev = dev_cluster(
            tmp_path / "dev", port=0, proxy_port=0, insecure_registries=(registry.host,)
        )
        async with dev as d:
            api = MachinesClient(d.api, d.token)
            try:
                code, out = await souk_deploy(folder, d.api, d.token)
                assert code == 0, out
                assert f"pushed {registry.host}/built:deploy-" in out
                [m] = await api.machines("built")
                assert m.config.image and m.config.image.startswith(f"{registry.host}/built:")
                assert "@sha256:" in m.config.image  # deployed by digest
                assert m.private_ip is not None
                url = f"http://{hostport(m.private_ip, 8080)}/index.html"
                assert await get_text(url) == "built here\n"

                (folder / "Dockerfile").write_text("FROM scratch\nCOPY missing /x\n")
                code, out = await souk_deploy(folder, d.api, d.token)
                assert code != 0 and "could not build the image" in out, out
                [again] = await api.machines("built")
                assert again.instance_id == m.instance_id  # nothing changed
            finally:
                for m in await api.machines("built"):
                    await api.destroy("built", m.id, force=True)
                    await api.wait("built", m.id, "destroyed", 30)
                await api.close()

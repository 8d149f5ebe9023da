"""A root worker reads an image's files (its /etc/passwd and /etc/group, for its USER) as the
container would: a link in the image resolves inside the image's root, absolute or climbing
with `..`, never to the host's file of that name."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.worker.daemon import make_app, make_driver, running
from souk.worker.engine import Engine
from souk.worker.oci.registry import RegistryClient
from tests.support.engines import destroy_all, settings
from tests.support.images import ImageSpec, TarBuilder, busybox_layer, layer
from tests.support.registry import Registry, push

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("runc") is None or os.geteuid() != 0, reason="needs root and runc"
    ),
]


# Each run says its ids, then points /etc/group, with a link that climbs out, at a file of its own.
SCRIPT = """id -u; id -g
busybox rm /etc/group; busybox ln -s ../../../../../../../../../../etc/gshadow /etc/group
echo wheel:x:4344: > /etc/gshadow"""


async def test_users_are_looked_up_through_links_resolved_inside_the_image(
    registry: Registry, client: RegistryClient, tmp_path: Path
) -> None:
    linked = (
        TarBuilder()
        .dir("etc", 0o777)  # the image's user (not its root) changes it
        .symlink("etc/passwd", "/etc/shadow")  # the host's shadow file, were it followed
        .file("etc/shadow", b"root:x:4242:4243:root:/root:/bin/sh\n")
        .file("etc/group", b"wheel:x:4343:\n")
    )
    spec = ImageSpec(
        [layer(busybox_layer().bytes()), layer(linked.bytes())],
        cmd=["sh", "-c", SCRIPT],
        user="root:wheel",
    )
    await push(client, registry, "linked:1", spec)
    s = replace(settings(tmp_path), insecure_registries=(registry.host,))
    config = {"image": f"{registry.host}/linked:1", "restart": {"policy": "no"}}
    async with running(Engine(s, make_driver("process", s))) as engine:
        try:
            async with TestClient(TestServer(make_app(engine))) as api:
                made = await api.post("/v1/machines", json={"app": "linked", "config": config})
                assert made.status == 201, await made.text()
                mid = (await made.json())["id"]
                for again in (False, True):  # the second run finds the link the first made
                    if again:
                        started = await api.post(f"/v1/machines/{mid}/start")
                        assert started.status == 200, await started.text()
                    waited = await api.get(
                        f"/v1/machines/{mid}/wait", params={"state": "stopped", "timeout": 30}
                    )
                    assert waited.status == 200, await waited.text()
                logs = await api.get(f"/v1/machines/{mid}/logs", params={"stream": "stdout"})
                out = (await logs.text()).split()
        finally:
            await destroy_all(engine)
    assert out == ["4242", "4343", "4242", "4344"]

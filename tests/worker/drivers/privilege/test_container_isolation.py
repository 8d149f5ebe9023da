"""Image machines run in a user namespace: root inside, one of the app's own ids on the host, with
runc's short capability list, no new privileges and a seccomp filter."""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.machines import app_users
from souk.worker.oci.registry import RegistryClient
from souk.worker.settings import WorkerSettings
from tests.support.engines import destroy_all
from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.registry import Registry, push

from .conftest import needs_root, pid_of

pytestmark = [
    pytest.mark.integration,
    needs_root,
    pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed"),
]

SCRIPT = """
echo "uid=$(id -u)"
busybox grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status
if busybox mount -t tmpfs none /tmp 2>/dev/null; then echo mount=ok; else echo mount=refused; fi
if busybox unshare -U true 2>/dev/null; then echo userns=ok; else echo userns=refused; fi
echo made > /made-inside
echo ready
exec sleep 600
"""
# CAP_AUDIT_WRITE (29), CAP_KILL (5), CAP_NET_BIND_SERVICE (10): what `runc spec` grants
RUNC_CAPS = (1 << 29) | (1 << 5) | (1 << 10)
CAP_SYS_ADMIN = 21


async def output_until(path: Path, line: str) -> dict[str, str]:
    for _ in range(500):
        text = path.read_text() if path.exists() else ""
        if line in text.splitlines():
            pairs = (x.replace(":\t", "=").partition("=") for x in text.splitlines())
            return {k: v.strip() for k, _, v in pairs}
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {line!r} in {path}: {text!r}")


def host_ids(pid: int) -> tuple[int, int, int]:
    """Real uid, real gid and effective capabilities of a process, as the host sees them."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]), int(fields["CapEff"], 16)


async def test_a_containers_root_is_root_only_inside(
    registry: Registry, client: RegistryClient, worker_settings: WorkerSettings
) -> None:
    spec = ImageSpec([layer(busybox_layer().bytes())], cmd=["sh", "-c", SCRIPT])
    await push(client, registry, "probe:1", spec)
    s = replace(worker_settings, insecure_registries=(registry.host,))
    async with running(Engine(s, make_driver("process", s))) as engine:
        try:
            m = await engine.create(
                CreateMachine(app="boxed", config=MachineConfig(image=f"{registry.host}/probe:1"))
            )
            pid = await pid_of(engine, m.id)
            inside = await output_until(s.rundir(m.id) / "stdout.log", "ready")
            uid, gid, caps = host_ids(pid)
            (app_uid,) = engine.store.read.execute(
                "SELECT uid FROM app_users WHERE app = 'boxed'"
            ).fetchone()
            rootfs = app_users.home(s.data_dir, "boxed", m.id) / "image" / "rootfs"
            owners = [os.lstat(rootfs / name).st_uid for name in ("", "bin/busybox", "made-inside")]
        finally:
            await destroy_all(engine)

    assert inside["uid"] == "0"
    assert (uid, gid) == (app_uid, app_uid) and uid >= app_users.BASE  # not root out here
    assert int(inside["CapEff"], 16) == caps == RUNC_CAPS
    assert not caps & (1 << CAP_SYS_ADMIN)
    assert inside["NoNewPrivs"] == "1"
    assert inside["Seccomp"] == "2"  # a filter is on
    assert inside["mount"] == "refused"
    assert inside["userns"] == "refused"
    # Its files, the image's (root's) and its own, are the app's ids on the host.
    assert owners == [app_uid, app_uid, app_uid]

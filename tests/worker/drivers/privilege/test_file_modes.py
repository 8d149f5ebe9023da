"""Whatever the umask it was started with, what souk writes of an app's data is its own: the
worker's data directory (database, logs, bundles, secrets) and the app registry's database hold
no file that a group or other user may read or write, and no such directory, but the few a
machine's user must pass through."""

from __future__ import annotations

import base64
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from souk.broker.registry import AppRegistry
from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.oci.registry import RegistryClient
from souk.worker.settings import WorkerSettings
from tests.support.broker_cluster import WorkerSpec, cluster, machine_body
from tests.support.engines import destroy_all
from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.registry import Registry, push

from .conftest import needs_root

pytestmark = [pytest.mark.integration, needs_root]

# Directories a machine's user must pass through (docs/worker.md's table), each with its mode.
PASSABLE = {
    ".": 0o711,  # the data directory: passable on the way to apps/, not listable
    "apps": 0o711,
    "volumes": 0o711,
}
# Files a machine's processes read as its own user, with their modes: its /etc/resolv.conf
# (the worker's resolver, docs/network.md), written by root alone.
READABLE = {"resolv.conf": 0o644}
# Directories whose contents are not souk's data but the app's own, with the modes the app
# (or its image) chose: a machine's home and an image's unpacked layers.
THE_APPS_OWN = ("apps", "images/layers")


@pytest.fixture
def open_umask() -> Iterator[None]:
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


def too_open(base: Path) -> list[str]:
    """Every path below `base` (itself included) with a group or other bit it should not have."""
    found = []
    for directory, dirs, files in os.walk(base):
        here = Path(directory)
        relative = here.relative_to(base).as_posix()
        mode = stat.S_IMODE(os.lstat(here).st_mode)
        if relative.split("/")[0] == "apps" and relative != "apps":
            dirs.clear()  # the app's own: docs/worker.md says who may pass
            continue
        if relative.startswith(THE_APPS_OWN[1]):
            dirs.clear()
            continue
        if mode & 0o077 and mode != PASSABLE.get(relative):
            found.append(f"{relative}/ {mode:o}")
        for name in files:
            path = here / name
            st = os.lstat(path)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode) or mode == READABLE.get(name):
                continue
            if mode & 0o077:
                found.append(f"{(here / name).relative_to(base)} {mode:o}")
    return found


async def test_nothing_written_is_open_to_others_whatever_the_umask(
    open_umask: None, tmp_path: Path
) -> None:
    async with cluster(tmp_path, [WorkerSpec("m1", "mad", driver="process")]) as c:
        resp = await c.call(
            "POST",
            "/v1/apps/demo/secrets",
            json={"values": {"KEY": base64.b64encode(b"k").decode()}},
        )
        assert resp.status in (200, 201), await resp.text()
        files = [{"guest_path": "/conf/key", "secret_name": "KEY"}]
        body = machine_body(init={"exec": ["sh", "-c", "cat conf/key; echo out; echo err >&2"]})
        body["config"].update(files=files, metadata={"owner": "someone"})
        made = await c.call("POST", "/v1/apps/demo/machines", json=body)
        assert made.status == 200, await made.text()
        mid = (await made.json())["id"]
        waited = await c.call(
            "GET", f"/v1/apps/demo/machines/{mid}/wait", params={"state": "stopped"}
        )
        assert waited.status == 200, await waited.text()
        registry = list(tmp_path.glob("registry.db*"))
        assert registry  # the app registry's database, and SQLite's files beside it
        found = too_open(tmp_path / "m1") + [
            f"{p.name} {stat.S_IMODE(p.stat().st_mode):o}"
            for p in registry
            if p.stat().st_mode & 0o077
        ]
    assert found == [], "\n".join(found)


def test_the_registrys_database_is_closed_in_a_directory_of_its_own(
    open_umask: None, tmp_path: Path
) -> None:
    """As `souk broker --registry-dir` opens it: the directory made 0700, the database 0600, and
    one an older broker left open is closed when it is opened again."""
    path = tmp_path / "registry" / "apps.db"
    AppRegistry(path).create("demo")
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    os.chmod(path, 0o644)
    AppRegistry(path)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()}
    assert modes and set(modes.values()) == {0o600}, modes


def writable_by_others(apps: Path) -> list[str]:
    """Below `apps/`, every entry root owns (the worker's, which it walks and mounts on as
    root) that anyone else may write to: there an app could plant a link for root to follow."""
    found = []
    for directory, dirs, files in os.walk(apps):
        here = Path(directory)
        for name in [*dirs, *files]:
            st = os.lstat(here / name)
            if st.st_uid == 0 and not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
                found.append(f"{(here / name).relative_to(apps)} {stat.S_IMODE(st.st_mode):o}")
        dirs[:] = [d for d in dirs if os.lstat(here / d).st_uid == 0]  # not into the app's own
    return found


@pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed")
async def test_an_image_machines_files_are_closed_whatever_the_umask(
    open_umask: None, registry: Registry, client: RegistryClient, worker_settings: WorkerSettings
) -> None:
    await push(client, registry, "closed:1", ImageSpec([layer(busybox_layer().bytes())]))
    s = replace(worker_settings, insecure_registries=(registry.host,))
    config = MachineConfig.model_validate(
        {
            "image": f"{registry.host}/closed:1",
            "init": {"exec": ["sh", "-c", "echo out; echo err >&2"]},
            "restart": {"policy": "no"},
            "files": [{"guest_path": "/etc/app.conf", "raw_value": "cG9ydD04MDgwCg=="}],
        }
    )
    async with running(Engine(s, make_driver("process", s))) as engine:
        try:
            made = await engine.create(CreateMachine(app="closed", config=config))
            ok, now = await engine.wait(made.id, "stopped", 60, None)
            assert ok, now.state
            found = too_open(s.data_dir) + writable_by_others(s.data_dir / "apps")
        finally:
            await destroy_all(engine)
    assert found == [], "\n".join(found)

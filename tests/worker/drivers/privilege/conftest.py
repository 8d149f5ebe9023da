"""Workers that run as root, as on a real host: their machines run as their apps' own users."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, running
from souk.worker.drivers import launcher
from souk.worker.engine import Engine
from souk.worker.oci.registry import RegistryClient
from souk.worker.settings import WorkerSettings
from tests.support.engines import destroy_all, settings
from tests.support.registry import Registry, registry_or_skip

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker has ids to give")

NOBODY = 65534
SLEEP = os.path.realpath(shutil.which("sleep") or "/bin/sleep")
# What the command sees at once: its groups, its ids, whether an exec may gain privileges.
LOOK = "cat /proc/self/cgroup; grep -E '^(Uid|Gid|Groups|NoNewPrivs):' /proc/self/status; echo end"


@pytest.fixture
def built() -> str:
    if launcher.LAUNCHER is None:
        pytest.skip("souk-launch is not built (scripts/setup.sh builds it)")
    return launcher.LAUNCHER


def assert_confined(text: str, group: str | None, uid: int) -> None:
    """What LOOK printed shows the group joined before the command ran, the app's ids with no
    supplementary groups, and no-new-privs."""
    if group is not None:
        assert group in text
    assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in text
    assert f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}" in text
    assert "NoNewPrivs:\t1" in text
    groups = next(line for line in text.splitlines() if line.startswith("Groups:"))
    assert groups.split(":")[1].strip() == ""  # none beside its own


def machine(app: str, argv: list[str], **config: object) -> CreateMachine:
    values: dict[str, object] = {"init": {"exec": argv}, "restart": {"policy": "no"}}
    values.update(config)
    return CreateMachine(app=app, config=MachineConfig.model_validate(values))


async def pid_of(engine: Engine, machine_id: str) -> int:
    ok, found = await engine.wait(machine_id, "started", 15, None)
    assert ok, found.state
    row = engine.store.read.execute("SELECT pid FROM machines WHERE id = ?", (machine_id,))
    return int(row.fetchone()["pid"])


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with registry_or_skip(tmp_path / "registry") as found:
        yield found


@pytest.fixture
async def client(registry: Registry) -> AsyncIterator[RegistryClient]:
    async with registry.client() as c:
        yield c


@pytest.fixture
def worker_settings(tmp_path: Path) -> WorkerSettings:
    return settings(tmp_path)


@pytest.fixture
async def engine(worker_settings: WorkerSettings) -> AsyncIterator[Engine]:
    async with running(Engine(worker_settings, make_driver("process", worker_settings))) as e:
        try:
            yield e
        finally:
            await destroy_all(e)

"""A guest whose command fails: its exit code reaches the worker (the guest init's report, or
qemu's own exit), and the machine's restart policy boots it again as many times as it says."""

from __future__ import annotations

import asyncio

import pytest

from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings
from tests.support.engines import destroy_all

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
]


async def test_a_failing_guest_is_restarted_by_policy_and_its_code_kept(
    vm_settings: WorkerSettings, busybox_image: str
) -> None:
    config = MachineConfig.model_validate(
        {
            "image": busybox_image,
            "init": {"cmd": ["sh", "-c", "sleep 1; exit 3"]},
            "restart": {"policy": "on-failure", "max_retries": 1},
        }
    )
    async with running(Engine(vm_settings, make_driver("vm", vm_settings))) as engine:
        try:
            machine = await engine.create(CreateMachine(app="web", config=config))
            for _ in range(2400):
                found = engine.get(machine.id, events=False)
                if found.state == "failed":
                    break
                await asyncio.sleep(0.1)
            assert (found.state, found.restart_count, found.exit_code) == ("failed", 1, 3)
            rundir = vm_settings.rundir(machine.id)
            assert (rundir / "guest_exit").read_text() == "3"  # the guest init's own report
            assert (rundir / "exit_code").read_text().strip() == str(3 << 1 | 1)  # and qemu's
        finally:
            await destroy_all(engine)

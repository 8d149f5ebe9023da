"""A worker keeps the secrets a machine's create or update brought, sealed with its own key:
each start opens them into the machine's env and files, on its own (a restart needs no broker);
an update replaces them; a key that no longer opens them fails the start, saying why."""

from __future__ import annotations

import os
from pathlib import Path

from souk.models.machine import CreateMachine, MachineConfig
from souk.sealing import WORKER_KEY_FILE
from souk.worker.daemon import make_driver, running
from souk.worker.drivers.base import Launch
from souk.worker.drivers.process import process_env
from souk.worker.engine import Engine
from tests.support.engines import destroy_all, settings

ECHO = MachineConfig.model_validate(
    {"init": {"exec": ["sh", "-c", 'echo "$TOKEN"']}, "restart": {"policy": "no"}}
)


async def test_each_start_opens_the_secrets_and_a_replaced_key_fails_it(tmp_path: Path) -> None:
    s = settings(tmp_path)
    async with running(Engine(s, make_driver("process", s))) as engine:
        machine = await engine.create(
            CreateMachine(app="demo", config=ECHO, secrets={"TOKEN": "t-1"})
        )
        assert (await engine.wait(machine.id, "stopped", 20, None))[0]
        updated = await engine.update(machine.id, ECHO, start=True, secrets={"TOKEN": "t-2"})
        assert (await engine.wait(machine.id, "stopped", 20, updated.instance_id))[0]
        log = s.rundir(machine.id) / "stdout.log"
        assert log.read_text().splitlines() == ["t-1", "t-2"]
    key = s.data_dir / WORKER_KEY_FILE
    key.write_bytes(os.urandom(32))  # a worker whose key was replaced
    async with running(Engine(s, make_driver("process", s))) as again:
        await again.submit(machine.id, "start")
        assert (await again.wait(machine.id, "failed", 20, None))[0]
        errors = [e for e in again.events(machine.id) if (e.type, e.step) == ("start", "error")]
        assert errors and "do not open with this worker's key" in str(errors[-1].request)
        assert "t-2" not in again.get(machine.id).model_dump_json()
        await destroy_all(again)  # and its cgroups with it


def test_a_process_that_ignores_the_app_secrets_gets_none_of_them(tmp_path: Path) -> None:
    config = MachineConfig.model_validate(
        {
            "env": {"TOKEN": "t-1", "PLAIN": "p"},  # the app's secret, as the worker merged it
            "processes": [
                {"cmd": ["a"]},
                {"cmd": ["b"], "ignore_app_secrets": True},
                {"cmd": ["c"], "ignore_app_secrets": True, "env": {"TOKEN": "its own"}},
            ],
        }
    )
    secrets = {"TOKEN": "t-1"}
    launch = Launch("m1", "demo", "mad", "i1", config, "mk", tmp_path, "10.0.0.2", secrets=secrets)
    envs = [process_env(launch, p) for p in config.processes]
    assert [e.get("TOKEN") for e in envs] == ["t-1", None, "its own"]
    assert all(e["PLAIN"] == "p" for e in envs)

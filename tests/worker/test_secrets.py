"""A worker keeps the secrets a machine's create or update brought, sealed with its own key:
each start opens them into the machine's env and files, on its own (a restart needs no broker);
an update replaces them; a key that no longer opens them fails the start, saying why."""

from __future__ import annotations

import os
from pathlib import Path

from souk.models.machine import CreateMachine, MachineConfig
from souk.sealing import WORKER_KEY_FILE
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from tests.support.engines import settings

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

"""Fly config fields a worker acts on: `schedule` and `auto_destroy`."""

from __future__ import annotations

import time
from pathlib import Path

from souk.models.machine import CreateMachine, MachineConfig
from souk.worker import schedules
from tests.support.engines import engine


def test_due_counts_from_the_last_start_or_creation() -> None:
    assert not schedules.due("hourly", None, created=1000.0, now=1000.0 + 3599)
    assert schedules.due("hourly", None, created=1000.0, now=1000.0 + 3600)
    assert not schedules.due("daily", 5000.0, created=1000.0, now=5000.0 + 3600)
    assert schedules.due("weekly", 0.0, created=0.0, now=7 * 86400.0)
    assert not schedules.due("monthly", 0.0, created=0.0, now=29 * 86400.0)


async def test_a_scheduled_machine_is_started_once_per_period(tmp_path: Path) -> None:
    config = MachineConfig.model_validate(
        {
            "init": {"exec": ["sh", "-c", "exit 0"]},
            "schedule": "hourly",
            "restart": {"policy": "no"},
        }
    )
    async with engine(tmp_path) as e:
        m = await e.create(CreateMachine(app="demo", config=config, start=False))
        now = time.time()
        assert await schedules.start_due(e, now) == []  # just created: its period starts now
        assert await schedules.start_due(e, now + 3601) == [m.id]
        assert (await e.wait(m.id, "stopped", 20, None))[0]  # ran, exited, waits for the next
        spawned = time.time()
        assert await schedules.start_due(e, spawned + 1800) == []
        assert await schedules.start_due(e, spawned + 3601) == [m.id]
        assert (await e.wait(m.id, "stopped", 20, None))[0]
        starts = [ev for ev in e.events(m.id) if ev.step == "spawn"]
        assert len(starts) == 2


async def test_auto_destroy_destroys_a_machine_that_is_done(tmp_path: Path) -> None:
    done = {"init": {"exec": ["sh", "-c", "exit 0"]}, "restart": {"policy": "no"}}
    async with engine(tmp_path) as e:
        m = await e.create(
            CreateMachine(
                app="demo", config=MachineConfig.model_validate({**done, "auto_destroy": True})
            )
        )
        assert (await e.wait(m.id, "destroyed", 20, None))[0]
        kept = await e.create(CreateMachine(app="demo", config=MachineConfig.model_validate(done)))
        assert (await e.wait(kept.id, "stopped", 20, None))[0]
        # a crash the policy restarts is not the end: on-failure restarts first
        crash = {"init": {"exec": ["sh", "-c", "exit 1"]}, "auto_destroy": True}
        retried = {**crash, "restart": {"policy": "on-failure", "max_retries": 1}}
        r = await e.create(CreateMachine(app="demo", config=MachineConfig.model_validate(retried)))
        assert (await e.wait(r.id, "destroyed", 30, None))[0]
        assert e.get(r.id, events=False).restart_count == 1

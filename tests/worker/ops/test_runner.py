"""The one runner, with a volume's kind (a machine's is run by every engine test): a step the data
directory refuses runs again and completes, with no failure logged; a step that fails otherwise
fails its operation where its kind says, and the queue goes on. Real store, steps of the test's
own that count their runs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from souk.worker.errors import StorageFull
from souk.worker.ops.fsm import VOLUME, VOLUME_OPERATIONS
from souk.worker.ops.progress import StepRun, advance, enqueue
from souk.worker.ops.runner import Runner
from souk.worker.ops.steps import StepTable
from souk.worker.state import volume_queries
from souk.worker.state.store import Store, Tx, now_iso
from souk.worker.volumes.operations import VOLUMES
from souk.worker.volumes.steps import VolumeHost
from tests.support.engines import settings

VOL = "vol_runner01"


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[VolumeHost]:
    store = Store(tmp_path / "worker.db", durable=False)
    yield VolumeHost(store, settings(tmp_path))
    store.close()


async def _queue(host: VolumeHost, *ops: str) -> None:
    def accept(tx: Tx) -> None:
        volume_queries.insert_volume(tx, VOL, "data", "demo", "creating", 16, 2, now_iso())
        for name in ops:
            enqueue(tx, VOLUMES, VOL, VOLUME_OPERATIONS[name], "created", {"size_mb": 16})

    await host.store.write(accept)


def _table(runs: list[str], fails: dict[str, BaseException]) -> StepTable[VolumeHost]:
    """Every volume step, recording its run; a step named in `fails` raises that once."""
    table: StepTable[VolumeHost] = StepTable(VOLUME.step_names)

    async def step(h: VolumeHost, run: StepRun) -> int:
        runs.append(run.step.name)
        if (exc := fails.pop(run.step.name, None)) is not None:
            raise exc
        return await advance(h.store, run)

    for name in VOLUME.step_names:
        table.implements(name)(step)
    return table


def _log(host: VolumeHost) -> list[tuple[str, str, str | None]]:
    rows = host.store.read.execute(
        "SELECT op, step, state FROM oplog WHERE resource = ? ORDER BY seq", (VOL,)
    )
    return [(r["op"], r["step"], r["state"]) for r in rows]


async def test_a_step_the_disk_refuses_runs_again_and_completes(host: VolumeHost) -> None:
    runs: list[str] = []
    full = StorageFull("the data directory is full", {"free_bytes": 0, "needed_bytes": 1})
    runner = Runner(host.store, VOLUMES, _table(runs, {"attach_loop": full}), host)
    await _queue(host, "create")
    runner.kick(VOL)
    assert await runner.settled(VOL, 10)
    assert runs == ["make_disk", "attach_loop", "attach_loop", "mount_fs"]
    row = volume_queries.existing_volume(host.store.read, VOL)
    assert (row["state"], row["projected"]) == ("created", "created")
    assert [step for _, step, _ in _log(host)] == [
        "accepted", "make_disk", "attach_loop", "mount_fs"
    ]  # fmt: skip
    assert host.store.watch.fault is None  # the next commit cleared it


async def test_a_failed_step_fails_its_operation_and_the_queue_goes_on(host: VolumeHost) -> None:
    runs: list[str] = []
    broken = RuntimeError("mkfs.ext4 exited with 1")
    runner = Runner(host.store, VOLUMES, _table(runs, {"make_disk": broken}), host)
    await _queue(host, "create", "destroy")
    runner.kick(VOL)
    assert await runner.settled(VOL, 10)
    assert runs[0] == "make_disk" and "attach_loop" not in runs
    assert runs[1:] == [s.name for s in VOLUME_OPERATIONS["destroy"].steps]
    log = _log(host)
    error = host.store.read.execute(
        "SELECT data FROM oplog WHERE resource = ? AND step = 'error'", (VOL,)
    ).fetchone()
    assert ("create", "error", "creating") in log and "mkfs.ext4" in json.loads(error[0])["error"]
    assert log[-1] == ("destroy", "release_disk", "destroyed")
    row = volume_queries.volume(host.store.read, VOL)
    assert row is not None and (row["state"], row["projected"]) == ("destroyed", "destroyed")

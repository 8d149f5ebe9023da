"""Faults the worker must ride out in-process: a disk that fills, old log entries, processes
that will not die, metadata that grows past its limit through small patches."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from souk.models.capacity import OfferRequest
from souk.models.machine import MAX_METADATA_BYTES, CreateMachine, GuestConfig, MachineConfig
from souk.worker.daemon import make_driver, running
from souk.worker.drivers.runc import _write_private
from souk.worker.engine import Engine
from souk.worker.errors import StorageFull
from souk.worker.host import logs, procfs
from souk.worker.http import http_error
from souk.worker.machines.operations import MACHINES
from souk.worker.machines.supervision import BACKOFF_MAX, backoff
from souk.worker.ops.fsm import OPERATIONS
from souk.worker.ops.progress import enqueue
from souk.worker.state.storage import StorageWatch, free_bytes
from tests.support.clients import Client
from tests.support.disks import fill, needs_mount, tmpfs
from tests.support.engines import settings
from tests.support.machines import kill_machine_processes
from tests.support.waiting import eventually


def request(argv: list[str], start: bool = True, **config: Any) -> CreateMachine:
    values: dict[str, Any] = {"init": {"exec": argv}, "restart": {"policy": "no"}, **config}
    return CreateMachine(app="demo", config=MachineConfig.model_validate(values), start=start)


@contextlib.asynccontextmanager
async def engine_on(data_dir: Path) -> AsyncIterator[Engine]:
    s = settings(data_dir.parent, data_dir=data_dir)
    async with running(Engine(s, make_driver("process", s))) as e:
        try:
            yield e
        finally:
            kill_machine_processes({m.id for m in e.machines(include_destroyed=True)})


# --- a full disk ------------------------------------------------------------------------------


@needs_mount
async def test_writes_on_a_full_disk_are_refused_with_the_cause_until_space_is_freed(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "data") as data:
        async with engine_on(data) as engine:
            m = await engine.create(request(["sleep", "30"], start=False))
            filler = fill(data)
            with pytest.raises(StorageFull) as refused:
                await engine.submit(m.id, "start")
            assert http_error(refused.value).http_status == 507
            assert refused.value.details is not None
            assert refused.value.details["free_bytes"] < refused.value.details["needed_bytes"]
            status = engine.status().storage
            assert (status.writable, status.reason) == (False, "insufficient_storage")
            assert not engine.offer(OfferRequest(guest=GuestConfig())).fits  # place elsewhere
            assert engine.get(m.id).state == "created"

            filler.unlink()
            await engine.submit(m.id, "start")  # the writer outlived the failed commits
            assert (await engine.wait(m.id, "started", 10, None))[0]
            assert engine.status().storage.writable
            assert engine.offer(OfferRequest(guest=GuestConfig())).fits
            await engine.submit(m.id, "destroy", {"force": True})
            assert (await engine.wait(m.id, "destroyed", 10, None))[0]


@needs_mount
def test_logs_are_rotated_on_a_full_disk_by_dropping_output(tmp_path: Path) -> None:
    """The copy a rotation keeps needs room a full disk lacks: the output goes, the space is
    freed, and the machine's next lines have room."""
    with tmpfs(tmp_path / "data", "size=4m") as data:
        rundir = data / "m1"
        rundir.mkdir()
        (rundir / "stdout.log").write_bytes(b"x" * (2 << 20))
        fill(data)
        logs.rotate_if_large(rundir, 1 << 20)
        assert (rundir / "stdout.log").stat().st_size == 0
        assert not (rundir / "stdout.log.1").exists()
        assert (free_bytes(data) or 0) >= 2 << 20


# --- operations logged by older workers ---------------------------------------------------


@pytest.mark.parametrize("name", ["TERM", "15", "sigterm"])
async def test_a_stop_logged_with_an_old_signal_name_still_runs(engine: Engine, name: str) -> None:
    """Older workers queued stops with whatever signal a client sent: what names a signal is
    normalized, and what does not (a number) becomes SIGTERM, instead of failing the machine."""
    # SIGINT (the default) is ignored, so only a SIGTERM stops it before the timeout
    m = await engine.create(request(["sh", "-c", "trap '' INT; exec sleep 30"]))
    try:
        assert (await engine.wait(m.id, "started", 10, None))[0]
        stop = OPERATIONS["stop"]
        await engine.store.write(
            lambda tx: enqueue(tx, MACHINES, m.id, stop, "started", {"signal": name})
        )
        engine.runner.kick(m.id)
        assert (await engine.wait(m.id, "stopped", 10, None))[0]
        signalled = [
            e.request for e in engine.events(m.id) if (e.type, e.step) == ("stop", "signal")
        ]
        assert signalled == [{"signal": "SIGTERM"}]
    finally:
        kill_machine_processes({m.id})


# --- nothing of a machine outlives it ---------------------------------------------------------


async def test_a_forced_destroy_waits_until_nothing_of_the_machine_runs(engine: Engine) -> None:
    """Its process and a child that left its process group, both deaf to SIGTERM and SIGINT:
    the reservation is released only once neither runs."""
    script = "trap '' INT TERM; setsid sleep 300 & exec sleep 300"
    m = await engine.create(request(["sh", "-c", script]))
    try:
        assert (await engine.wait(m.id, "started", 10, None))[0]
        await eventually(lambda: len(procfs.processes_of(m.id)) == 2)

        await engine.submit(m.id, "destroy", {"force": True})
        assert (await engine.wait(m.id, "destroyed", 15, None))[0]
        assert procfs.processes_of(m.id) == []
        assert engine.capacity().reserved.cpus == 0
    finally:
        kill_machine_processes({m.id})


async def test_a_stopped_machine_leaves_no_child_running(engine: Engine) -> None:
    """The process exits on SIGINT; its child, in its process group, ignores it."""
    script = "(trap '' INT TERM; exec sleep 300) & exec sleep 300"
    m = await engine.create(request(["sh", "-c", script]))
    try:
        assert (await engine.wait(m.id, "started", 10, None))[0]
        await eventually(lambda: len(procfs.processes_of(m.id)) == 2)

        await engine.submit(m.id, "stop")
        assert (await engine.wait(m.id, "stopped", 15, None))[0]
        assert procfs.processes_of(m.id) == []
        await engine.submit(m.id, "destroy")
        assert (await engine.wait(m.id, "destroyed", 15, None))[0]
    finally:
        kill_machine_processes({m.id})


# --- metadata --------------------------------------------------------------------------------


async def test_metadata_patches_may_not_add_up_past_the_limit(client: Client) -> None:
    half = "x" * (MAX_METADATA_BYTES // 2)
    body = {"app": "demo", "config": {"init": {"exec": ["sleep", "30"]}}, "start": False}
    mid = (await (await client.post("/v1/machines", json=body)).json())["id"]
    ok = await client.patch(f"/v1/machines/{mid}/metadata", json={"set": {"a": half}})
    assert ok.status == 200
    resp = await client.patch(f"/v1/machines/{mid}/metadata", json={"set": {"b": half}})
    assert resp.status == 413, await resp.text()
    assert (await resp.json())["code"] == "metadata_too_large"
    machine = await (await client.get(f"/v1/machines/{mid}")).json()  # still readable
    assert set(machine["config"]["metadata"]) == {"a"}
    replaced = await client.patch(
        f"/v1/machines/{mid}/metadata", json={"set": {"b": half}, "delete": ["a"]}
    )
    assert replaced.status == 200


# --- what the runtime is given ------------------------------------------------------------


def test_a_runtime_spec_is_written_for_root_alone(tmp_path: Path) -> None:
    """It holds the machine's environment, secrets included: 0600 from its first byte, also
    over an earlier, looser file."""
    path = tmp_path / "config.json"
    path.write_text("{}")
    os.chmod(path, 0o644)
    (tmp_path / "config.json.tmp").write_text("stale")
    os.chmod(tmp_path / "config.json.tmp", 0o666)
    _write_private(path, json.dumps({"process": {"env": ["SECRET=1"]}}).encode())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["process"]["env"] == ["SECRET=1"]
    assert not (tmp_path / "config.json.tmp").exists()


async def test_waiting_out_storage_faults_backs_off_to_a_cap_forever(tmp_path: Path) -> None:
    """Hours of retries (thousands of doublings) must not overflow the delay."""
    watch = StorageWatch(tmp_path)
    assert watch.fault_from(OSError(errno.ENOSPC, "No space left on device")) is not None
    watch.cleared()  # so the pause ends at once, once it has computed its delay
    await asyncio.wait_for(watch.pause(5000), 1)
    assert watch.fault is None


def test_a_machine_crashing_for_hours_backs_off_to_the_cap() -> None:
    assert backoff(5000) == BACKOFF_MAX

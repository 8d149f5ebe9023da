"""No orphans: the destroy of a create whose answer was lost is retried until the worker answers,
and fences the id there, so that the create arriving late is refused."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from souk.broker.placement.candidates import Candidate
from souk.broker.placement.reservation import Reserver
from souk.clients.workers import WorkerCallError, WorkerClient
from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_app, make_driver, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings

CONFIG = MachineConfig.model_validate({"init": {"exec": ["sleep", "60"]}})


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    settings = WorkerSettings(
        name="w1", region="mad", data_dir=tmp_path / "w1", cpus=4, memory_mb=4096, durable=False
    )
    async with running(Engine(settings, make_driver("sim", settings))) as engine:
        yield engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def candidate(address: str) -> Candidate:
    return Candidate("w1", address, ("shared",), 4, 4096, 4, 4096)


async def until(check: object, what: str) -> None:
    deadline = time.monotonic() + 15
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_lost_creates_cleanup_is_retried_until_the_worker_answers(engine: Engine) -> None:
    made = await engine.create(CreateMachine(app="demo", id="lost0000a1", config=CONFIG))
    port = free_port()
    client = WorkerClient()
    reserver = Reserver(client)
    try:
        # the worker does not answer yet: nothing listens on its port
        reserver._cleanup(candidate(f"http://127.0.0.1:{port}"), made.id)
        await asyncio.sleep(0.5)
        assert reserver.pending == 1, "the cleanup gave up on a worker that did not answer"
        assert engine.get(made.id).state != "destroyed"
        async with TestServer(make_app(engine), host="127.0.0.1", port=port):
            await until(lambda: reserver.pending == 0, "the cleanup never finished")
            await until(lambda: engine.get(made.id).state == "destroyed", "never destroyed")
    finally:
        await client.close()


async def test_a_create_arriving_after_its_fenced_destroy_is_refused(engine: Engine) -> None:
    client = WorkerClient()
    try:
        async with TestServer(make_app(engine), host="127.0.0.1") as server:
            url = str(server.make_url("")).rstrip("/")
            with pytest.raises(WorkerCallError) as lost:
                await client.destroy("w1", url, "late0000a1", force=True, fence=True)
            assert lost.value.http_status == 404
            late = CreateMachine(app="demo", id="late0000a1", config=CONFIG)
            with pytest.raises(WorkerCallError) as refused:
                await client.create("w1", url, late, timeout=5)
            assert refused.value.http_status == 409
            assert "too late" in refused.value.message
            assert all(m.id != "late0000a1" for m in engine.machines(None))
            # an unfenced destroy of an unknown id leaves its create alone
            with pytest.raises(WorkerCallError):
                await client.destroy("w1", url, "free0000a1", force=True)
            ok = await client.create(
                "w1", url, CreateMachine(app="demo", id="free0000a1", config=CONFIG), timeout=5
            )
            assert ok.id == "free0000a1"
    finally:
        await client.close()

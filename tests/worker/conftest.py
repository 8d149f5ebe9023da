"""In-process worker fixtures: a real engine and store on a temporary directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.worker.daemon import make_app, make_driver, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings


def settings(tmp_path: Path, **overrides: object) -> WorkerSettings:
    values: dict[str, object] = {
        "name": "w1",
        "region": "mad",
        "data_dir": tmp_path / "w1",
        "cpus": 4,
        "memory_mb": 4096,
        "durable": False,
    }
    values.update(overrides)
    return WorkerSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    s = settings(tmp_path)
    async with running(Engine(s, make_driver("process", s))) as e:
        yield e


@pytest.fixture
async def sim_engine(tmp_path: Path) -> AsyncIterator[Engine]:
    s = settings(tmp_path)
    async with running(Engine(s, make_driver("sim", s))) as e:
        yield e


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    async with TestClient(TestServer(make_app(engine))) as c:
        yield c

"""In-process worker fixtures: a real engine and store on a temporary directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.worker.daemon import make_app
from souk.worker.engine import Engine
from tests.support.clients import Client
from tests.support.engines import engine as started_engine


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with started_engine(tmp_path, "process") as e:
        yield e


@pytest.fixture
async def sim_engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with started_engine(tmp_path, "sim") as e:
        yield e


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[Client]:
    async with TestClient(TestServer(make_app(engine))) as c:
        yield c

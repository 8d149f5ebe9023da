"""A real worker whose machines are on the private network (it must be root)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.worker.daemon import make_app
from tests.support.clients import Client
from tests.support.engines import engine as started_engine

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    async with started_engine(tmp_path, "process") as e, TestClient(TestServer(make_app(e))) as c:
        yield c

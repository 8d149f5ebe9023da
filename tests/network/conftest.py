"""The private network's fixtures: a real worker whose machines are on it (`client`, in this
process), and what the machines of a host of its own reached (`seen`, `one_host.py`). Each
test module that uses them skips without root."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.worker.daemon import make_app
from tests.support.clients import Client
from tests.support.engines import engine as started_engine

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    async with started_engine(tmp_path, "process") as e, TestClient(TestServer(make_app(e))) as c:
        yield c


@pytest.fixture(scope="session")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the machines of `one_host.py` reached, run once for the session's tests."""
    tmp = tmp_path_factory.mktemp("one_host")
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "tests.network.one_host", str(tmp)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result

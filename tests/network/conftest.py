"""A real worker whose machines are on the private network (it must be root)."""

from __future__ import annotations

import json
import os
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

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    async with started_engine(tmp_path, "process") as e, TestClient(TestServer(make_app(e))) as c:
        yield c


ROOT = Path(__file__).resolve().parents[2]


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

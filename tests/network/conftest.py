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


OWN_SOCKETS = (
    'mkdir -p /run/wireguard && mount -t tmpfs -o mode=0700 bed /run/wireguard && exec "$@"'
)


def bed_findings(
    tmp_path_factory: pytest.TempPathFactory, bed: str, timeout: float
) -> dict[str, Any]:
    """What the machines of the test bed `tests/network/<bed>.py` reached: it runs in a network
    namespace of its own (its hosts, namespaces inside that one) and prints its findings as the
    last line, JSON; its parts' logs are shown if it fails. Its mount namespace is its own too,
    with a directory of wireguard-go's sockets of its own: they are named after the nodes, and
    two beds run at once both have a node `wa`."""
    tmp = tmp_path_factory.mktemp(bed)
    bed_argv = [sys.executable, "-m", f"tests.network.{bed}", str(tmp)]
    done = subprocess.run(
        ["unshare", "-n", "-m", "sh", "-c", OWN_SOCKETS, "bed", *bed_argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    logs = "".join(p.read_text()[-2000:] for p in tmp.glob("*.log"))
    assert done.returncode == 0, done.stderr[-3000:] + logs
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="session")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the machines of `one_host.py` reached, run once for the session's tests."""
    return bed_findings(tmp_path_factory, "one_host", 120)

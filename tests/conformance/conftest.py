"""A real broker in front of real process-driver workers in two regions, for the scenarios."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.broker_cluster import Cluster, WorkerSpec, cluster


@pytest.fixture
async def fly(tmp_path: Path) -> AsyncIterator[Cluster]:
    specs = [
        WorkerSpec("m1", "mad", cpus=8, memory_mb=8192, driver="process"),
        WorkerSpec("a1", "ams", cpus=2, memory_mb=2048, driver="process"),
    ]
    async with cluster(tmp_path, specs, deadline=5.0) as c:
        yield c

"""The broker's fixtures: clusters of in-process sim workers behind a real broker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from souk.catalog.bus import InProcessBus
from tests.support.broker_cluster import Cluster, ClusterFactory, WorkerSpec, cluster


@pytest.fixture
def make_cluster(tmp_path: Path) -> ClusterFactory:
    def factory(
        specs: list[WorkerSpec],
        deadline: float = 2.0,
        bus: InProcessBus | None = None,
        reserve_over_bus: bool = False,
    ) -> contextlib.AbstractAsyncContextManager[Cluster]:
        return cluster(tmp_path, specs, deadline, bus, reserve_over_bus)

    return factory


@pytest.fixture
async def small(make_cluster: ClusterFactory) -> AsyncIterator[Cluster]:
    """Two regions: mad with two workers, ams with one."""
    specs = [WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad"), WorkerSpec("a1", "ams")]
    async with make_cluster(specs) as c:
        yield c

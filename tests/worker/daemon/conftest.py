"""Real `souk worker` processes on loopback; each one, and every machine process it left, is
killed at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.worker_process import WorkerFactory, WorkerProcess, worker_processes


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[WorkerFactory]:
    """Starts real workers (`spawn_worker(cpus=..., memory_mb=..., driver=...)`)."""
    with worker_processes(tmp_path) as spawn:
        yield spawn


@pytest.fixture
def worker(spawn_worker: WorkerFactory) -> WorkerProcess:
    return spawn_worker()

"""The worker's URL paths are spelled in its client only: the broker calls typed methods."""

from __future__ import annotations

import re
from pathlib import Path

import souk

SRC = Path(souk.__file__).parent
WORKER_PATH = re.compile(r"""["']/v1/(machines|capacity|offers|cordon|uncordon)\b""")


def test_only_the_worker_client_spells_worker_paths() -> None:
    spelled = [
        f"{path.relative_to(SRC)}:{n}"
        for path in sorted((SRC / "broker").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if WORKER_PATH.search(line)
    ]
    assert spelled == []
    assert WORKER_PATH.search((SRC / "clients" / "workers.py").read_text())


def test_the_generic_calls_are_private() -> None:
    from souk.clients.workers import WorkerClient

    assert not hasattr(WorkerClient, "request") and not hasattr(WorkerClient, "action")

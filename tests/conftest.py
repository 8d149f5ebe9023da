"""Suite-wide hooks."""

from __future__ import annotations

import logging

import pytest


def pytest_unconfigure(config: pytest.Config) -> None:
    # Machines outlive the in-process workers that started them, as they outlive a worker on a
    # real host. One that exits once the run is over makes asyncio's child watcher warn that the
    # test's loop is closed, below pytest's summary; nothing is left to report by then.
    logging.getLogger("asyncio").setLevel(logging.ERROR)

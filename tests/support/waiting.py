"""Waiting for a condition that other processes or tasks bring about, with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def eventually(check: Callable[..., Any], timeout: float = 15.0, every: float = 0.02) -> Any:
    """Polls a sync or async check until it returns something truthy, and returns that.

    The check is called without arguments; `...` lets it be a lambda binding a loop variable
    as a default (`lambda mid=mid: ...`), which mypy cannot match to a no-argument callable."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(every)


def wait_until(check: Callable[..., bool], timeout: float = 15.0, what: str = "") -> None:
    """The blocking `eventually`, for tests that drive processes from a plain function."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what}")
        time.sleep(0.05)

"""A task repeated for as long as its part runs: one tick at a time, never two at once, and a
tick that fails logged without ending the ones after it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

Interval = float | Callable[[], float]


async def every(
    interval: Interval,
    tick: Callable[[], Awaitable[object]],
    *,
    what: str,
    log: logging.Logger,
) -> None:
    """Wait `interval` seconds (a number, or read before each wait), run `tick`, forever: until
    cancelled. A tick's exception is logged as `what failed` and the next tick comes as due."""
    while True:
        await asyncio.sleep(interval() if callable(interval) else interval)
        try:
            await tick()
        except Exception:  # one bad tick must not end the task
            log.exception("%s failed", what)

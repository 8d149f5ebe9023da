"""Work the event loop hands to a thread, and must not walk away from."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def to_thread_to_its_end(fn: Callable[..., T], *args: Any) -> T:
    """`asyncio.to_thread`, except that a cancelled caller waits for the thread before it
    unwinds: a thread cannot be stopped midway, and what follows (a cleanup, an undo) must not
    race what the thread is still making."""
    return await to_its_end(asyncio.to_thread(fn, *args))


async def to_its_end(work: Awaitable[T]) -> T:
    """`work` run to its end even if its caller is cancelled meanwhile (once or more), the
    cancel raised after it: what follows the cancel must not race what `work` still makes."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        raise

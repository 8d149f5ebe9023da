"""Work the event loop hands to a thread, and must not walk away from."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def to_thread_to_its_end(fn: Callable[..., T], *args: Any) -> T:
    """`asyncio.to_thread`, except that a cancelled caller waits for the thread before it
    unwinds: a thread cannot be stopped midway, and what follows (a cleanup, an undo) must not
    race what the thread is still making."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait([work])
        raise

"""Streams that last only as long as the caller's token: a token is checked when a request
arrives, and a stream (catalog changes, followed logs, the dashboard's events) can outlive that
check by hours. The access middleware leaves a way to check the token again (`CREDENTIAL`);
a stream reads its source through `while_allowed`, which checks it before each item it passes
on and every `RECHECK` seconds of quiet (revocation and expiry both), and ends the stream once
the token no longer holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from aiohttp import web

from souk.web.errors import ApiError

T = TypeVar("T")

# Why the request's credential no longer holds: None while it does, else (reason, message).
Lapse = Callable[[], tuple[str, str] | None]
CREDENTIAL: web.RequestKey[Lapse] = web.RequestKey("credential")
RECHECK = 1.0  # seconds between two checks of a stream's token


def lapsed(request: web.Request) -> ApiError | None:
    """A 401 saying why the caller's token no longer holds, or None (also for a server that
    checks no tokens)."""
    check = request.get(CREDENTIAL)
    why = check() if check is not None else None
    return None if why is None else ApiError(401, why[0], f"bad token: {why[1]}")


async def while_allowed(
    request: web.Request, source: AsyncIterator[T], every: float = RECHECK
) -> AsyncIterator[T]:
    """`source`'s items while the caller's token holds; then its 401 (`ApiError`), which a
    stream already answering ends on. Waits on `source` at most `every` seconds at a time, so
    that a quiet stream is checked too."""

    async def next_item() -> T:
        return await anext(source)

    pending: asyncio.Task[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.create_task(next_item())
            done, _ = await asyncio.wait({pending}, timeout=every)
            refusal = lapsed(request)  # a set lookup and a clock read: checked at every wake
            if refusal is not None:
                raise refusal
            if done:
                finished, pending = pending, None
                try:
                    item = finished.result()
                except StopAsyncIteration:
                    return
                yield item
    finally:
        if pending is not None:  # let the source take its cancellation before it is closed
            pending.cancel()
            await asyncio.wait({pending})

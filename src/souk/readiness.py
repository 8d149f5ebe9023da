"""Waiting on the event loop for a file descriptor to be ready, with no thread: a process's
pidfd is readable once the process has exited; a socket is writable once it takes data again,
or once its non-blocking connect has been answered."""

from __future__ import annotations

import asyncio
from typing import Literal


def resolve(future: asyncio.Future[None]) -> None:
    """The loop's callback for a ready descriptor, which it may call again before it is removed."""
    if not future.done():
        future.set_result(None)


async def ready(fd: int, to: Literal["read", "write"]) -> None:
    """Once `fd` is ready `to` read or write."""
    loop = asyncio.get_running_loop()
    watch, unwatch = (
        (loop.add_reader, loop.remove_reader)
        if to == "read"
        else (loop.add_writer, loop.remove_writer)
    )
    done: asyncio.Future[None] = loop.create_future()
    watch(fd, resolve, done)
    try:
        await done
    finally:
        unwatch(fd)

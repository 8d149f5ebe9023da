"""At most one task per resource (a machine, a volume) for one duty (running its queue, watching
its process)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

RECANCEL_AFTER = 1.0  # seconds a cancelled task has to end before it is cancelled again


class ResourceTasks:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def ensure(self, resource: str, start: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start the resource's task unless one is already running."""
        current = self._tasks.get(resource)
        if current is None or current.done():
            self._tasks[resource] = asyncio.create_task(start())

    def replace(self, resource: str, start: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Cancel the resource's task, and start another once it has ended (never two at once)."""
        current = self._tasks.get(resource)
        if current is None or current.done():
            self._tasks[resource] = asyncio.create_task(start())
            return
        current.cancel()
        self._tasks[resource] = asyncio.create_task(_after(current, start))

    def forget(self, resource: str) -> None:
        self._tasks.pop(resource, None)

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel every task; returns them, to be awaited."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        return tasks


async def _after(
    previous: asyncio.Task[None], start: Callable[[], Coroutine[Any, Any, None]]
) -> None:
    """`start` once `previous` has ended (its outcome is its own to report); cancelled again
    while it has not, should something on its way out have swallowed the cancel."""
    while not previous.done():
        previous.cancel()
        await asyncio.wait([previous], timeout=RECANCEL_AFTER)
    await start()

"""Waiting for machines' processes to exit, for the drivers: each machine's exit code to come,
and how to notice that a process that is not the worker's child has gone."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable

from souk.readiness import ready
from souk.worker.drivers.base import Handle
from souk.worker.host import procfs

log = logging.getLogger("souk.worker")


class ExitCodes:
    """Each watched machine's exit code, as a future: what `Driver.wait` answers."""

    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[int | None]] = {}

    def expect(self, machine_id: str, code: Awaitable[int | None]) -> asyncio.Future[int | None]:
        future = self._futures[machine_id] = asyncio.ensure_future(code)
        return future

    def watching(self, machine_id: str) -> bool:
        """Whether the machine's process is still watched, not yet exited."""
        future = self._futures.get(machine_id)
        return future is not None and not future.done()

    def __contains__(self, machine_id: str) -> bool:
        return machine_id in self._futures

    def pop(self, machine_id: str) -> asyncio.Future[int | None] | None:
        return self._futures.pop(machine_id, None)

    async def wait(self, machine_id: str) -> int | None:
        """Its exit code once it exits; None at once for a machine not watched. A cancelled
        waiter leaves the watch going."""
        future = self._futures.get(machine_id)
        if future is None:
            return None
        return await asyncio.shield(future)


async def child_exit(pid: int, reap: Callable[[], int] | None = None) -> int:
    """The exit code of one of the worker's own children (negative: the signal that ended it),
    read once it exits: on its pidfd where the kernel has them, so that no thread waits for each
    child (asyncio's child watcher starts one per process, on the spawn's path); else waited for
    in a thread. `reap`: how `subprocess` reaps a child it spawned (its `wait`); else waitpid."""
    reaped = reap or functools.partial(_waited, pid)
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return await asyncio.to_thread(reaped)
    try:
        await ready(fd, "read")  # once it has exited, reaped or not
    finally:
        os.close(fd)
    return reaped()  # it has exited: reaped at once


def _waited(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


async def poll_until_gone(handle: Handle, interval: float) -> None:
    while procfs.is_alive(handle.pid, handle.pid_start):
        await asyncio.sleep(interval)


async def until_gone(handle: Handle, interval: float) -> None:
    """Wait for a process that is not our child: on its pidfd where the kernel has them, else
    polling every `interval`."""
    try:
        fd = os.pidfd_open(handle.pid)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            if procfs.is_alive(handle.pid, handle.pid_start):
                await ready(fd, "read")
        finally:
            os.close(fd)
    await poll_until_gone(handle, interval)


async def thaw_to_die(
    thaw: Callable[[str, Handle | None], Awaitable[None]], machine_id: str, handle: Handle | None
) -> None:
    """The thaw that lets a machine's killed processes die (a task of a frozen v1 group cannot
    until thawed); one that fails is told and the kill goes on, its SIGKILLs sent again until
    nothing is left."""
    try:
        await thaw(machine_id, handle)
    except Exception as exc:
        log.warning("%s: not thawed to be killed: %s", machine_id, exc)

"""The sim driver runs nothing: machines go through every state and step of the real worker, but
no process is started. It lets a benchmark host a thousand workers on one small machine."""

from __future__ import annotations

import asyncio
import itertools

from souk.worker.drivers.base import Handle, Launch

_pids = itertools.count(1_000_000)


class SimDriver:
    name = "sim"

    def __init__(self) -> None:
        self._exits: dict[str, asyncio.Future[int | None]] = {}

    async def prepare(self, launch: Launch) -> None:
        return None

    async def spawn(self, launch: Launch) -> Handle:
        self._exits.setdefault(launch.machine_id, asyncio.get_running_loop().create_future())
        return Handle(next(_pids), launch.marker)

    def adopt(self, machine_id: str, marker: str, handle: Handle | None) -> Handle | None:
        if machine_id in self._exits:
            return handle
        return None

    async def wait(self, machine_id: str) -> int | None:
        exit_future = self._exits.get(machine_id)
        if exit_future is None:
            return None
        return await asyncio.shield(exit_future)

    async def stop(
        self, machine_id: str, handle: Handle | None, signal: str, timeout: float
    ) -> None:
        exit_future = self._exits.pop(machine_id, None)
        if exit_future is not None and not exit_future.done():
            exit_future.set_result(0)

    async def cleanup(self, launch: Launch) -> None:
        self._exits.pop(launch.machine_id, None)

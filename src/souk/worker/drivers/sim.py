"""The sim driver runs nothing: machines go through every state and step of the real worker, but
no process is started. It lets a benchmark host a thousand workers on one small machine."""

from __future__ import annotations

import asyncio
import itertools

from souk.worker.drivers.base import ExecResult, Handle, Launch
from souk.worker.drivers.exits import ExitCodes

_pids = itertools.count(1_000_000)


class SimDriver:
    name = "sim"

    def __init__(self) -> None:
        self._exits = ExitCodes()

    async def prepare(self, launch: Launch) -> str | None:
        return None

    async def spawn(self, launch: Launch) -> Handle:
        if launch.machine_id not in self._exits:  # resolved by `stop`
            self._exits.expect(launch.machine_id, asyncio.get_running_loop().create_future())
        return Handle(next(_pids), launch.marker)

    def adopt(self, machine_id: str, marker: str, handle: Handle | None) -> Handle | None:
        if machine_id in self._exits:
            return handle
        return None

    async def wait(self, machine_id: str) -> int | None:
        return await self._exits.wait(machine_id)

    async def stop(
        self, machine_id: str, handle: Handle | None, signal: str, timeout: float
    ) -> None:
        exit_future = self._exits.pop(machine_id)
        if exit_future is not None and not exit_future.done():
            exit_future.set_result(0)

    async def remaining(self, machine_id: str, handle: Handle | None) -> list[int]:
        return []

    async def cleanup(self, launch: Launch) -> None:
        self._exits.pop(launch.machine_id)

    async def freeze(self, machine_id: str, handle: Handle | None) -> None:
        return None

    async def thaw(self, machine_id: str, handle: Handle | None) -> None:
        return None

    async def signal(self, machine_id: str, handle: Handle | None, signal: str) -> None:
        return None

    async def exec(
        self, launch: Launch, handle: Handle | None, argv: list[str], stdin: bytes, timeout: float
    ) -> ExecResult:
        """Nothing runs: the command "succeeds" with no output."""
        return ExecResult(b"", b"", 0)

    async def processes(self, machine_id: str, handle: Handle | None) -> list[int]:
        return []

    async def close(self) -> None:
        pass

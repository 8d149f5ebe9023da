"""A short host command run to its end, its output read: one way for the commands souk waits on
(runc's, the development images' builders), each caller naming its own failure; and a
long-running helper process ended."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Completed:
    code: int
    out: bytes
    err: bytes

    @property
    def failed(self) -> bool:
        return self.code != 0


async def completed(*argv: str, stdin: int | None = None) -> Completed:
    """`argv` run to its exit, stdout and stderr read whole; `stdin`: the worker's own when None,
    as asyncio has it (`asyncio.subprocess.DEVNULL` for none)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    return Completed(proc.returncode if proc.returncode is not None else -1, out, err)


async def ended(proc: asyncio.subprocess.Process, grace: float = 5.0) -> None:
    """`proc` told to end (SIGTERM), killed if it has not within `grace` seconds, and reaped."""
    if proc.returncode is not None:
        return
    proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        proc.kill()
        await proc.wait()

"""Running a command for `exec`: output read through pipes up to a bound, a timeout that kills
the command's whole process group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as signals
from typing import Any

from souk.models.machine_ops import MAX_EXEC_OUTPUT
from souk.worker.drivers.base import ExecResult, ExecTimeout

KILL_GRACE = 2.0  # after the timeout's signal, before SIGKILL


async def _collect(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    """Everything up to `limit` bytes; the rest is read and dropped, so the command never
    blocks on a full pipe."""
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)


async def run(
    argv: list[str],
    stdin: bytes,
    timeout: float,
    on_timeout: int = signals.SIGKILL,
    **popen: Any,
) -> ExecResult:
    """Run `argv` in a session of its own. On timeout its process group gets `on_timeout`
    (runc forwards a SIGTERM to the command it runs), then SIGKILL."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        **popen,
    )

    async def talk() -> tuple[bytes, bytes, int]:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        proc.stdin.close()
        out, err = await asyncio.gather(
            _collect(proc.stdout, MAX_EXEC_OUTPUT), _collect(proc.stderr, MAX_EXEC_OUTPUT)
        )
        return out, err, await proc.wait()

    task = asyncio.ensure_future(talk())
    try:
        out, err, code = await asyncio.wait_for(asyncio.shield(task), timeout)
    except TimeoutError:
        _killpg(proc.pid, on_timeout)
        try:
            await asyncio.wait_for(asyncio.shield(task), KILL_GRACE)
        except TimeoutError:
            _killpg(proc.pid, signals.SIGKILL)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await proc.wait()
        raise ExecTimeout(
            f"{argv[0]} ran past its timeout of {timeout:g}s and was killed"
        ) from None
    if code < 0:
        return ExecResult(out, err, 128 - code, -code)
    return ExecResult(out, err, code)


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)

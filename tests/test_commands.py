"""A host command run to its end (`souk.commands`): its exit code and both outputs, read whole."""

from __future__ import annotations

import asyncio

from souk.commands import completed


async def test_exit_code_and_both_outputs_are_kept_apart() -> None:
    done = await completed("sh", "-c", "echo out; echo err >&2; exit 3")
    assert (done.code, done.out, done.err, done.failed) == (3, b"out\n", b"err\n", True)


async def test_stdin_closed_when_asked() -> None:
    done = await completed("cat", stdin=asyncio.subprocess.DEVNULL)
    assert (done.code, done.out, done.failed) == (0, b"", False)

"""A host command run to its end (`souk.commands`): its exit code and both outputs, read whole;
a helper process ended, by SIGTERM or, when it ignores that, SIGKILL."""

from __future__ import annotations

import asyncio
import signal

from souk.commands import completed, ended


async def test_exit_code_and_both_outputs_are_kept_apart() -> None:
    done = await completed("sh", "-c", "echo out; echo err >&2; exit 3")
    assert (done.code, done.out, done.err, done.failed) == (3, b"out\n", b"err\n", True)


async def test_stdin_closed_when_asked() -> None:
    done = await completed("cat", stdin=asyncio.subprocess.DEVNULL)
    assert (done.code, done.out, done.failed) == (0, b"", False)


async def test_a_process_that_ends_on_sigterm_is_reaped() -> None:
    proc = await asyncio.create_subprocess_exec("sleep", "60")
    await ended(proc)
    assert proc.returncode == -signal.SIGTERM


async def test_a_process_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    proc = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        "trap '' TERM; echo ready; while :; do sleep 0.1; done",
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    await proc.stdout.readline()  # its trap set
    await ended(proc, grace=0.3)
    assert proc.returncode == -signal.SIGKILL

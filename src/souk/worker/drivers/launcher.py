"""How the process driver starts a command as an app, in the machine's cgroups from its first
instruction, unable to gain privileges by any exec after (no-new-privs: the host's setuid
programs run as the app, as a container's do): through `souk-launch` (launch.c), which Python
can vfork, or without it through Python's own change of ids and a `preexec_fn`, for which
Python forks the whole worker.

`souk-launch` is built by scripts/setup.sh into the virtualenv's `bin`, beside the interpreter;
it is looked for there, then in PATH, and used only if it speaks this module's `PROTOCOL` (a
build left from an older souk would refuse the flags it is given)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from souk.worker.drivers.base import HostUser

log = logging.getLogger("souk.worker.launcher")

NAME = "souk-launch"
PROTOCOL = "2"  # the flags `launching` passes: launch.c's PROTOCOL, raised with them
ASK_WAIT = 5.0  # at most this long for a launcher to say its protocol
READY_WAIT = 1.0  # at most this long for the launcher to become the command
PR_SET_NO_NEW_PRIVS = 38  # <linux/prctl.h>
_libc = ctypes.CDLL(None, use_errno=True)


def find(path: str | None = None) -> str | None:
    """The launcher in `path` (by default: beside the interpreter, else in PATH); None without
    one that speaks `PROTOCOL` (said in the log: machines then start after a fork of the
    worker)."""
    if path is None:
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(NAME, path=path)
    if not found:
        return None
    try:
        said = subprocess.run(
            [found, "--protocol"], capture_output=True, text=True, timeout=ASK_WAIT, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        said = ""
    if said != PROTOCOL:
        log.warning(
            "%s speaks protocol %r, not %s: not used (rebuild it: scripts/setup.sh)",
            found,
            said,
            PROTOCOL,
        )
        return None
    return os.path.realpath(found)


LAUNCHER = find()


@dataclass
class Launching:
    """A command ready for `subprocess.Popen`: its argv and Popen's other arguments. `ready`,
    when set, is the read end of a pipe that closes as the command itself runs (`became`)."""

    argv: list[str]
    popen: dict[str, Any] = field(default_factory=dict)
    ready: int | None = None


@contextlib.contextmanager
def launching(
    argv: list[str],
    user: HostUser | None,
    procs: list[Path],
    ready: bool = True,
) -> Iterator[Launching]:
    """`argv` to run as `user` (None: as the worker) having joined the cgroups whose
    `cgroup.procs` are `procs`, with no new privileges; with `ready`, through the launcher, a
    pipe that says when it runs. A worker that is not root (no `user`, no `procs`) runs it as
    it is. The descriptors it opens for the child are closed on the way out, once the process
    is spawned; `ready`'s is the caller's to close."""
    fds = [os.open(p, os.O_WRONLY) for p in procs]  # the kernel checks the opener's rights
    pipe: tuple[int, int] | None = None
    try:
        if user is None and not fds:
            yield Launching(argv)
        elif LAUNCHER is None:
            popen: dict[str, Any] = {"preexec_fn": _confiner(fds)}
            if user is not None:
                popen.update(user=user.uid, group=user.gid, extra_groups=[])
            yield Launching(argv, popen)
        else:
            flags = [f for fd in fds for f in ("--join", str(fd))] + ["--no-new-privs"]
            passed = list(fds)
            if ready:
                pipe = os.pipe()
                flags += ["--ready", str(pipe[1])]
                passed.append(pipe[1])
            if user is not None:
                flags += ["--ids", f"{user.uid}:{user.gid}"]
            yield Launching(
                [LAUNCHER, *flags, "--", *argv],
                {"pass_fds": tuple(passed)},
                pipe[0] if pipe else None,
            )
    except BaseException:
        if pipe is not None:
            os.close(pipe[0])
        raise
    finally:
        for fd in [*fds, *(pipe[1:] if pipe else ())]:
            os.close(fd)


def _confiner(fds: list[int]) -> Callable[[], None]:
    def confine() -> None:  # in the child, as the app already: the kernel checks the opener's
        for fd in fds:  # rights to a cgroup.procs
            os.write(fd, b"0")
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "no-new-privs")

    return confine


async def became(ready: int, timeout: float = READY_WAIT) -> None:
    """Once the launcher has run the command (or failed), or `timeout` seconds; closes `ready`.
    Read on the event loop: the pipe says when, nothing polls."""
    loop = asyncio.get_running_loop()
    closed = loop.create_future()

    def readable() -> None:
        if not closed.done():
            closed.set_result(None)

    loop.add_reader(ready, readable)
    try:
        await asyncio.wait_for(closed, timeout)
    except TimeoutError:
        pass
    finally:
        loop.remove_reader(ready)
        os.close(ready)

"""How the process driver starts a command as an app, in the machine's cgroups from its first
instruction, unable to gain privileges by any exec after (no-new-privs: the host's setuid
programs run as the app, as a container's do): through `souk-launch` (launch.c), a machine by
its server (`spawner.py`) and an `exec` on its command line, which Python can vfork; or without
it through Python's own change of ids and a `preexec_fn`, for which Python forks the whole
worker.

`souk-launch` is built by scripts/setup.sh into the virtualenv's `bin`, beside the interpreter;
it is looked for there, then in PATH, and used only if it speaks this module's `PROTOCOL` (a
build left from an older souk would not understand what it is asked)."""

from __future__ import annotations

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
from typing import IO, Any

from souk.worker.host.identity import HostUser

log = logging.getLogger("souk.worker.launcher")

NAME = "souk-launch"
PROTOCOL = "6"  # its flags and its server's messages: launch.c's PROTOCOL, raised with them
ASK_WAIT = 5.0  # at most this long for a launcher to say its protocol
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


@dataclass(frozen=True)
class Network:
    """A machine's own network namespace (a path under /var/run/netns), and the resolv.conf
    its processes see in place of the host's (None: the host's)."""

    netns: Path
    resolv: Path | None = None


@contextlib.contextmanager
def entered(network: Network | None) -> Iterator[list[int]]:
    """The namespace and resolv.conf open, for the child to enter and mount (in that order)."""
    fds: list[int] = []
    try:
        if network is not None:
            fds.append(os.open(network.netns, os.O_RDONLY | os.O_CLOEXEC))
            if network.resolv is not None:
                fds.append(os.open(network.resolv, os.O_RDONLY | os.O_CLOEXEC))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


@dataclass
class Launching:
    """A command ready for `subprocess.Popen`: its argv and Popen's other arguments."""

    argv: list[str]
    popen: dict[str, Any] = field(default_factory=dict)

    def detached(self, out: IO[bytes], err: IO[bytes], cwd: Path) -> subprocess.Popen[bytes]:
        """A machine's main process, started by Popen itself, as asyncio's subprocess would (a
        vfork, on the loop), without its child watcher: its caller reads the exit on a pidfd
        (`child_exit`). In a session of its own, stdin closed, its output to `out` and `err`."""
        return subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=cwd,
            start_new_session=True,
            **self.popen,
        )


@contextlib.contextmanager
def opened(procs: list[Path]) -> Iterator[list[int]]:
    """The `cgroup.procs` files, open for the child to join: the kernel checks the opener's
    rights, the worker's. Closed on the way out, once the child has them."""
    fds: list[int] = []
    try:
        fds.extend(os.open(p, os.O_WRONLY) for p in procs)
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def numbered(prefix: str, values: list[str]) -> dict[str, str]:
    """`values` as the variables `prefix`0, `prefix`1, ...: how souk-launch is handed an
    environment it must not run with itself (`--environ`, `--processes`)."""
    return {f"{prefix}{k}": value for k, value in enumerate(values)}


def handed_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for `souk-launch --environ`: under its own names, so that no variable of a
    machine's is one the launcher's own start reads, whoever it runs as."""
    return {
        "SOUK_ENVS": str(len(env)),
        **numbered("SOUK_ENV", [f"{k}={v}" for k, v in env.items()]),
    }


@contextlib.contextmanager
def launching(
    argv: list[str],
    user: HostUser | None,
    procs: list[Path],
    env: dict[str, str],
    network: Network | None = None,
) -> Iterator[Launching]:
    """`argv` to run as `user` (None: as the worker) in `env` and `network`, having joined the
    cgroups whose `cgroup.procs` are `procs`, with no new privileges, on the launcher's command
    line (which gets `env` under other names, `handed_env`: it may be root until the exec).
    Without the launcher, a worker that is not root (no `user`, no `procs`, no `network`) runs
    it as it is: a `preexec_fn` for no-new-privs alone would make Python fork the worker; Python
    applies `env` at the exec, after the change of ids."""
    popen: dict[str, Any]
    with opened(procs) as fds, entered(network) as net:
        if LAUNCHER is not None:
            flags = ["--netns", str(net[0])] if net else []  # first: joined before the rest
            flags += [f for fd in fds for f in ("--join", str(fd))] + ["--no-new-privs"]
            if len(net) > 1:
                flags += ["--resolv", str(net[1])]
            if user is not None:
                flags += ["--ids", f"{user.uid}:{user.gid}"]
            popen = {"pass_fds": (*fds, *net), "env": handed_env(env)}
            yield Launching([LAUNCHER, *flags, "--environ", "--", *argv], popen)
        elif user is None and not fds and not net:
            yield Launching(argv, {"env": env})
        else:
            # Python changes ids before a preexec_fn; entering a namespace needs root's, so
            # with a network the ids change in it, after.
            later = user if net else None
            popen = {"preexec_fn": _confiner(fds, net, later), "env": env}
            if user is not None and later is None:
                popen.update(user=user.uid, group=user.gid, extra_groups=[])
            yield Launching(argv, popen)


def _confiner(fds: list[int], net: list[int], user: HostUser | None) -> Callable[[], None]:
    def confine() -> None:  # in the child (as the app already, unless `user`): the kernel
        if net:  # checks the opener's rights to a cgroup.procs
            _enter_network(net)
        for fd in fds:
            os.write(fd, b"0")
        if user is not None:
            os.setgroups([])
            os.setresgid(user.gid, user.gid, user.gid)
            os.setresuid(user.uid, user.uid, user.uid)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "no-new-privs")

    return confine


CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000
MS_BIND, MS_REC, MS_SLAVE = 0x1000, 0x4000, 1 << 19


def _enter_network(net: list[int]) -> None:
    """What souk-launch's --netns and --resolv do, in a forked child (one thread: it may)."""
    if _libc.setns(net[0], CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "entering the machine's network")
    if len(net) > 1:
        source = os.fsencode(os.readlink(f"/proc/self/fd/{net[1]}"))  # by path, as launch.c
        if (
            _libc.unshare(CLONE_NEWNS) != 0
            or _libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None) != 0
            or _libc.mount(source, b"/etc/resolv.conf", None, MS_BIND, None) != 0
        ):
            raise OSError(ctypes.get_errno(), "mounting the machine's resolv.conf")

"""Machines started by a `souk-launch --serve` of the worker's own (launch.c): a small process
that forks each machine's process from itself, joins it to its cgroups, drops its ids and runs
its command, so that a start costs neither a fork of the worker nor an exec of one more program
(a quarter to half a millisecond each on a virtual machine's page faults).

Each child is made the worker's (CLONE_PARENT): the worker reaps it and reads its exit as if it
had spawned it. A request is one message on a SOCK_SEQPACKET pair, answered in order once the
command runs (or failed to), so the event loop never waits on the spawn itself. The server ends
when the worker closes its end or dies; a server that died is started again at the next spawn,
and the children of the starts it left unanswered are killed if they have not run their command
yet."""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import os
import signal
import socket
import struct
import subprocess
from collections import deque
from pathlib import Path
from typing import NamedTuple

from souk.readiness import resolve
from souk.worker.drivers.exits import child_exit
from souk.worker.drivers.launcher import Network, entered, opened
from souk.worker.host import procfs
from souk.worker.host.identity import HostUser

IDS, NO_NEW_PRIVS, NETNS, RESOLV = 1, 2, 4, 8  # launch.c's flags
_REQUEST = struct.Struct("=5I")  # flags, uid, gid, argc, envc
_ANSWER = struct.Struct("=3i")  # pid, errno, step
# launch.c's `enum step`: what the server or the child could not do, for the error it says.
STEPS = {
    1: "souk-launch refused the request",
    2: "starting the machine's process",
    3: "entering the working directory",
    4: "joining the machine's cgroup",
    5: "dropping to the app's ids",
    6: "setting no-new-privs",
    8: "entering the machine's network",
}
EXEC = 7
SEND_BUFFER = 4 << 20  # the largest request: twice what execve takes of argv and env
CLOSE_WAIT = 5.0  # for the server to end once the worker closes its end
SO_SNDBUFFORCE = 32  # <asm-generic/socket.h>: above the host's limit, for a root worker
# Every spawner's server in this process (a worker has one; a test process, several): what
# `_before_exec` must not take for a start's child.
_SERVERS: set[subprocess.Popen[bytes]] = set()


class Command(NamedTuple):
    """What a machine's process runs, and as whom."""

    path: str  # argv[0] as exec finds it (in the env's PATH)
    argv: list[str]
    env: dict[str, str]
    user: HostUser | None  # None: as the worker
    network: Network | None = None  # None: the host's own network


def _request(command: Command, cwd: Path) -> bytes:
    texts = [command.path, str(cwd), *command.argv]
    for name, value in command.env.items():
        if not name or "=" in name:
            raise ValueError(f"illegal environment variable name: {name!r}")
        texts.append(f"{name}={value}")
    encoded = [os.fsencode(text) for text in texts]
    if any(b"\0" in text for text in encoded):
        raise ValueError("embedded null byte")
    user = command.user
    flags = NO_NEW_PRIVS | (IDS if user is not None else 0)
    if command.network is not None:
        flags |= NETNS | (RESOLV if command.network.resolv is not None else 0)
    ids = (user.uid, user.gid) if user is not None else (0, 0)
    head = _REQUEST.pack(flags, *ids, len(command.argv), len(command.env))
    return head + b"".join(text + b"\0" for text in encoded)


class Spawner:
    """The worker's end of one `souk-launch --serve`, started at the first spawn."""

    def __init__(self, launcher: str) -> None:
        self.launcher = launcher
        self._server: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._answers: deque[asyncio.Future[tuple[int, int, int]]] = deque()
        self._sending = asyncio.Lock()
        self._null: int | None = None  # every machine's stdin
        self._reaping: set[asyncio.Future[int]] = set()
        self._room: asyncio.Future[None] | None = None  # what a send waits on: a full buffer

    async def spawn(
        self, command: Command, cwd: Path, output: tuple[int, int], procs: list[Path]
    ) -> int:
        """The pid of `command`'s process, with `output` as its stdout and stderr (its stdin
        /dev/null), in the cgroups of `procs`, once it runs; the child is the worker's to
        reap. A command it could not run raises as `subprocess` would (FileNotFoundError,
        PermissionError), any other step an OSError saying which; nothing runs then, and the
        failed child is reaped. A spawn cancelled while it waits leaves its process running, to
        be adopted by its marker, as after a crash of the worker."""
        message = _request(command, cwd)
        with opened(procs) as joins, entered(command.network) as network:
            answer = await self._send(message, [*output, *network, *joins])
        pid, error, step = await answer
        if not error:
            return pid
        if pid > 0:
            await child_exit(pid)  # it exits at once
        if step == EXEC:
            raise OSError(error, os.strerror(error), command.argv[0])  # its subclass by errno
        raise LaunchFailed(error, f"{STEPS.get(step, 'souk-launch')}: {os.strerror(error)}")

    async def _send(
        self, message: bytes, output_and_joins: list[int]
    ) -> asyncio.Future[tuple[int, int, int]]:
        """Sent in turn, so that answers come in the order of `_answers`; a full send buffer
        (`SEND_BUFFER` of requests the server has not read) waits for room on the loop, never
        blocking it: the server may be waiting for the loop to read its answers."""
        async with self._sending:
            retried = False
            while True:
                sock, null = self._connected()
                fds = array.array("i", [null, *output_and_joins])
                try:
                    sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                    break
                except BlockingIOError:
                    await self._writable(sock)
                except (BrokenPipeError, ConnectionResetError):
                    if retried:  # a server that dies at once: said, not started over and over
                        raise
                    self._lost(sock)  # killed since the loop last read: another, once
                    retried = True
                except OSError as exc:
                    if exc.errno == errno.EMSGSIZE:
                        raise TooLarge(exc.errno, f"a request of {len(message)} bytes") from exc
                    raise
            answer: asyncio.Future[tuple[int, int, int]]
            answer = asyncio.get_running_loop().create_future()
            self._answers.append(answer)
            return answer

    def _connected(self) -> tuple[socket.socket, int]:
        if self._null is None:
            self._null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        if self._sock is not None:
            return self._sock, self._null
        if self._server is not None:  # one that died, or (killed now) one stuck in a spawn
            self._server.kill()
            self._server.wait()
            _SERVERS.discard(self._server)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            for option, value in ((SO_SNDBUFFORCE, SEND_BUFFER), (socket.SO_SNDBUF, SEND_BUFFER)):
                with contextlib.suppress(OSError):
                    ours.setsockopt(socket.SOL_SOCKET, option, value)
                    break
            self._server = subprocess.Popen(
                [self.launcher, "--serve", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # not in the worker's terminal's way
            )
            _SERVERS.add(self._server)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        asyncio.get_running_loop().add_reader(ours, self._read, ours)
        self._sock = ours
        return ours, self._null

    async def _writable(self, sock: socket.socket) -> None:
        """Once the socket takes a message again, or is lost (the send then goes to another)."""
        loop = asyncio.get_running_loop()
        ready = self._room = loop.create_future()
        loop.add_writer(sock, resolve, ready)
        try:
            await ready
        finally:
            self._room = None
            if self._sock is sock:
                loop.remove_writer(sock)

    def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(_ANSWER.size)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if len(data) != _ANSWER.size or not self._answers:
                self._lost(sock)
                return
            answer = self._answers.popleft()
            if not answer.done():
                answer.set_result(_ANSWER.unpack(data))

    def _lost(self, sock: socket.socket) -> None:
        """The server is gone (killed), or the worker closes its end: what waited fails, and
        the children of those starts that have not run their command yet are killed, so that
        none of them runs unknown; the next spawn starts another server."""
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock)
        loop.remove_writer(sock)
        if self._room is not None:  # a send waiting for room: it goes to the next server
            resolve(self._room)
        sock.close()
        if self._sock is sock:
            self._sock = None
        if self._answers:
            for pid in self._before_exec():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                reaped = asyncio.ensure_future(child_exit(pid))  # the worker's own child
                self._reaping.add(reaped)
                reaped.add_done_callback(self._reaping.discard)
        gone = OSError(errno.EPIPE, "souk-launch --serve exited")
        while self._answers:
            answer = self._answers.popleft()
            if not answer.done():
                answer.set_exception(gone)

    def _before_exec(self) -> list[int]:
        """The worker's children that are forks of a server but no server: a start's child
        before its exec (read from /proc, only when a server is lost). An `exec`'s launcher,
        also the worker's child, has its own command line."""
        servers = {p.pid for p in _SERVERS}
        launcher = os.path.realpath(self.launcher)
        found = []
        for pid in procfs.children(os.getpid()):
            if pid in servers or procfs.program(pid) != launcher:
                continue
            if (procfs.arguments(pid) or [])[1:2] == [b"--serve"]:
                found.append(pid)
        return found

    async def close(self) -> None:
        """Closes the worker's end, as when the server is lost (`_lost`): the server ends once
        it has answered what it was sent, or is killed after `CLOSE_WAIT`."""
        if self._sock is not None:
            self._lost(self._sock)
        if self._server is not None:
            try:
                await asyncio.to_thread(self._server.wait, CLOSE_WAIT)
            except subprocess.TimeoutExpired:  # stuck on a child the kernel holds (unkillable)
                self._server.kill()
                self._server.wait()
            _SERVERS.discard(self._server)
            self._server = None
        if self._null is not None:
            os.close(self._null)
            self._null = None


class LaunchFailed(OSError):
    """A step of the launch before the command's exec failed (its message says which)."""


class TooLarge(OSError):
    """A command and environment larger than the socket takes in one message (`SEND_BUFFER`,
    or the host's limit for a worker that may not raise its own): nothing was sent."""

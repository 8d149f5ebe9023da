"""souk-launch's server (`--serve`) and the worker's end of it: a machine's process is the
worker's child, in its groups, as its app, with nothing of the worker's open; whatever fails
runs nothing and says why; the server survives bad requests and is replaced if it dies."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from souk.worker.drivers import spawner as spawner_module
from souk.worker.drivers.exits import child_exit
from souk.worker.drivers.spawner import _SERVERS, Command, LaunchFailed, Spawner
from souk.worker.host import procfs
from souk.worker.host.cgroups import Cgroups
from souk.worker.host.identity import HostUser

from .conftest import LOOK, NOBODY, assert_confined, needs_root

pytestmark = [pytest.mark.integration, needs_root]

APP = HostUser(NOBODY, NOBODY, 1)
ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture
async def spawner(built: str) -> AsyncIterator[Spawner]:
    found = Spawner(built)
    yield found
    await found.close()


def sh(script: str, user: HostUser | None = APP, env: dict[str, str] = ENV) -> Command:
    return Command("/bin/sh", ["sh", "-c", script], env, user)


async def run(
    spawner: Spawner, command: Command, cwd: Path, procs: Sequence[Path] = ()
) -> tuple[int, str]:
    """The command's exit code and what it wrote."""
    out = cwd / f"out-{uuid.uuid4().hex[:6]}"
    with open(out, "wb") as file:
        pid = await spawner.spawn(command, cwd, (file.fileno(), file.fileno()), list(procs))
    code = await child_exit(pid)  # the worker's own child: its exit is ours to read
    return code, out.read_text()


async def test_a_machine_runs_as_its_app_in_its_groups_with_only_its_stdio(
    spawner: Spawner, cgroups: Cgroups, tmp_path: Path
) -> None:
    machine_id = "m" + uuid.uuid4().hex[:12]
    procs = cgroups.prepare(machine_id, 1, 64)
    script = f"{LOOK}; ls /proc/self/fd; pwd; cut -d' ' -f6 /proc/$$/stat; echo $$; cat; exit 7"
    try:
        code, seen = await run(spawner, sh(script), tmp_path, procs)
    finally:
        cgroups.remove(machine_id)
    assert code == 7
    assert_confined(seen, f"/{cgroups.group}/{machine_id}", NOBODY)
    lines = seen.split("end\n", 1)[1].split("\n")
    # 0-2 and the one `ls` opens: neither the cgroups', nor the server's socket, nor a pipe
    assert lines[:5] == ["0", "1", "2", "3", str(tmp_path)]
    assert lines[5] == lines[6]  # a session of its own
    assert lines[7:] == [""]  # its stdin is /dev/null


async def test_a_worker_without_ids_to_give_runs_it_as_itself(
    spawner: Spawner, tmp_path: Path
) -> None:
    script = "id -u; echo $HOME; grep NoNewPrivs /proc/self/status"
    code, seen = await run(spawner, sh(script, None, {**ENV, "HOME": "/x"}), tmp_path)
    assert (code, seen) == (0, f"{os.geteuid()}\n/x\nNoNewPrivs:\t1\n")  # no-new-privs all the same


@pytest.mark.parametrize(
    ("path", "cwd", "procs", "error", "says"),
    [
        ("/no/such/program", ".", [], FileNotFoundError, "No such file"),
        ("/etc/passwd", ".", [], PermissionError, "Permission denied"),
        ("/bin/sh", "no-such-dir", [], LaunchFailed, "entering the working directory"),
        ("/bin/sh", ".", ["/dev/full"], LaunchFailed, "joining the machine's cgroup"),
    ],
)
async def test_what_cannot_run_runs_nothing_and_says_why(
    spawner: Spawner,
    tmp_path: Path,
    path: str,
    cwd: str,
    procs: list[str],
    error: type[Exception],
    says: str,
) -> None:
    ran = tmp_path / "ran"
    command = Command(path, ["x", "-c", f"touch {ran}"], ENV, APP)
    with pytest.raises(error, match=says):
        await spawner.spawn(command, tmp_path / cwd, (2, 2), [Path(p) for p in procs])
    assert not ran.exists()
    assert children(zombie=True) == []  # the failed child was reaped
    code, _ = await run(spawner, sh("exit 3"), tmp_path)  # and the server goes on
    assert code == 3


@pytest.mark.parametrize(
    "env", [{"A": "x\0y"}, {"A=B": "x"}, {"": "x"}], ids=["nul", "equals", "empty"]
)
async def test_an_environment_exec_cannot_take_is_refused_before_anything_runs(
    spawner: Spawner, tmp_path: Path, env: dict[str, str]
) -> None:
    with pytest.raises(ValueError):
        await spawner.spawn(sh("true", env={**ENV, **env}), tmp_path, (2, 2), [])


async def test_large_environments_and_many_spawns_at_once_each_get_their_own_answer(
    spawner: Spawner, tmp_path: Path
) -> None:
    """More requests than the kernel queues on the socket, and messages larger than its default
    buffer: each spawn gets the pid of its own command."""
    big = {f"BIG{i}": "x" * 100_000 for i in range(8)}  # 800 kB, as execve takes it

    async def one(n: int) -> tuple[int, str]:
        env = {**ENV, **(big if n % 10 == 0 else {})}
        return await run(spawner, sh(f"echo {n} ${{#BIG0}}; exit {n}", env=env), tmp_path)

    done = await asyncio.gather(*(one(n) for n in range(60)))
    assert done == [(n, f"{n} {100_000 if n % 10 == 0 else 0}\n") for n in range(60)]


@contextlib.asynccontextmanager
async def stuck(spawner: Spawner, tmp_path: Path) -> AsyncIterator[tuple[asyncio.Task[int], int]]:
    """A start whose child stays before its exec, the server waiting on it: its "cgroup.procs"
    is a FIFO whose pipe is full. The start's task and its child's pid; on the way out the pipe
    is gone, and a child still joining it would fail there, never running its command."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(writer, b"x" * 4096)
        out = (tmp_path / "out").open("wb")
        command = sh("echo ran")
        start = asyncio.create_task(spawner.spawn(command, tmp_path, (out.fileno(),) * 2, [fifo]))
        out.close()  # the server has its own, once it answers
        deadline = time.monotonic() + 10
        while not (child := [p for p in children() if p not in {s.pid for s in _SERVERS}]):
            assert time.monotonic() < deadline, "no start's child appeared"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not start.done()
        yield start, child[0]
    finally:
        os.close(writer)
        os.close(reader)


async def gone_without_running(pid: int, tmp_path: Path) -> None:
    """The start's child was killed and reaped, and its command never ran."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"{pid} lives on"
        await asyncio.sleep(0.01)
    assert (tmp_path / "out").read_text() == ""


async def serving(spawner: Spawner, tmp_path: Path) -> subprocess.Popen[bytes]:
    """The spawner's server, once it has started something."""
    await run(spawner, sh("true"), tmp_path)
    assert spawner._server is not None
    return spawner._server


async def assert_replaced(
    spawner: Spawner, tmp_path: Path, server: subprocess.Popen[bytes]
) -> None:
    """The next spawn runs, by another server."""
    code, seen = await run(spawner, sh("echo again"), tmp_path)
    assert (code, seen) == (0, "again\n")
    assert spawner._server is not None and spawner._server.pid != server.pid


async def test_a_server_killed_fails_what_waits_kills_its_child_and_is_replaced(
    spawner: Spawner, tmp_path: Path
) -> None:
    server = await serving(spawner, tmp_path)
    async with stuck(spawner, tmp_path) as (start, child):
        server.send_signal(signal.SIGKILL)
        with pytest.raises(OSError, match="exited"):
            await start
        await gone_without_running(child, tmp_path)  # not left to run unknown
        await assert_replaced(spawner, tmp_path, server)


async def test_a_server_killed_with_its_queue_full_sends_what_waited_to_the_next(
    spawner: Spawner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spawner_module, "SEND_BUFFER", 8 << 10)  # a few requests fill it
    server = await serving(spawner, tmp_path)
    command = sh("echo ran", env={**ENV, "PAD": "x" * 3000})
    async with stuck(spawner, tmp_path) as (start, child):
        queued = [asyncio.ensure_future(run(spawner, command, tmp_path)) for _ in range(30)]
        await asyncio.sleep(0.2)
        assert spawner._room is not None  # a send waits for room
        server.send_signal(signal.SIGKILL)
        outcomes = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 10)
    lost = [o for o in outcomes if isinstance(o, OSError) and "exited" in str(o)]
    ran = [o for o in outcomes if o == (0, "ran\n")]
    assert lost and ran and len(lost) + len(ran) == len(queued)  # sent before, or after
    with pytest.raises(OSError, match="exited"):
        await start
    await gone_without_running(child, tmp_path)


async def test_a_server_killed_while_idle_is_replaced_at_the_next_spawn(
    spawner: Spawner, tmp_path: Path
) -> None:
    server = await serving(spawner, tmp_path)
    server.kill()
    server.wait()  # not yielding: the loop has not read the end of its socket yet
    await assert_replaced(spawner, tmp_path, server)


async def test_a_start_still_before_its_exec_at_close_is_killed(
    spawner: Spawner, tmp_path: Path
) -> None:
    server = await serving(spawner, tmp_path)
    async with stuck(spawner, tmp_path) as (start, child):
        await asyncio.wait_for(spawner.close(), 5)  # CLOSE_WAIT not needed: the server ends
        assert server.returncode is not None
        with pytest.raises(OSError, match="exited"):
            await start
        await gone_without_running(child, tmp_path)


def children(zombie: bool = False) -> list[int]:
    """This process's children that are souk-launch's server or were forked by it (exited and
    not reaped, with `zombie`)."""
    found = procfs.children(os.getpid())
    if zombie:
        return [pid for pid in found if procfs.start_time(pid) is None]
    return [pid for pid in found if os.path.basename(procfs.program(pid) or "") == "souk-launch"]


def test_the_server_answers_bad_requests_and_ends_with_the_worker(built: str) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = subprocess.Popen([built, "--serve", str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    null = os.open(os.devnull, os.O_RDONLY)
    stdio = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", null, null, null))]
    try:
        head = struct.Struct("=5I")
        strings = b"/bin/true\0/\0true\0"
        for message, rights in [
            (b"short", stdio),  # shorter than its head
            (head.pack(0, 0, 0, 1, 0) + strings, []),  # no stdio
            (head.pack(0, 0, 0, 0, 0) + strings, stdio),  # no argv
            (head.pack(0, 0, 0, 2, 0) + strings, stdio),  # strings missing
            (head.pack(0, 0, 0, 1, 0) + strings + b"more", stdio),  # unterminated
            (head.pack(0, 0, 0, 1, 0) + strings[:-1], stdio),  # unterminated
        ]:
            ours.sendmsg([message], rights)
            assert struct.unpack("=3i", ours.recv(12)) == (0, 22, 1)  # EINVAL, the request's
        ours.sendmsg([head.pack(0, 0, 0, 1, 0) + strings], stdio)
        pid, error, step = struct.unpack("=3i", ours.recv(12))
        assert (error, step) == (0, 0)
        assert os.waitpid(pid, 0)[1] == 0  # ran, and was this process's child
    finally:
        os.close(null)
        ours.close()
    assert server.wait(timeout=10) == 0  # the worker's end closed: it ends

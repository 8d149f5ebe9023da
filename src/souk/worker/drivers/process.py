"""The process driver: a machine is a host command in its own process group and directory.

Processes are started in a new session so they outlive a crash of the worker; each carries a
marker in its environment, so a restarted worker finds (adopts) it instead of starting a second
copy. Output goes straight to files in the machine's directory (no pipe to the worker that would
break if the worker died); `logs.py` keeps those files within their size budget.

A root worker runs each app's processes as the app's own host user (`app_users.py`), with no
supplementary groups, in the machine's own home directory; the worker keeps the process group,
the cgroup and the log files, which stay root's.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal as signals
import stat
import time
from pathlib import Path
from typing import IO, Any

from souk.worker import procfs
from souk.worker.cgroups import Cgroups
from souk.worker.drivers.base import Handle, HostUser, Launch
from souk.worker.drivers.exits import poll_until_gone, until_gone

POLL = 0.05
SETPRIV_WAIT = 1.0  # at most this long for setpriv to become the machine's command


def machine_env(launch: Launch) -> dict[str, str]:
    """What a machine sees: its config's env plus who and where it is."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(launch.home or launch.rundir),
        "LANG": "C.UTF-8",
    }
    env.update(launch.config.env)
    env.update(
        {
            "SOUK_MACHINE_ID": launch.machine_id,
            "SOUK_APP_NAME": launch.app,
            "SOUK_REGION": launch.region,
            "SOUK_INSTANCE_ID": launch.instance_id,
            "SOUK_PRIVATE_IP": launch.private_ip,
            "SOUK_MARKER": launch.marker,
        }
    )
    return env


class ProcessDriver:
    name = "process"

    def __init__(self, cgroups: Cgroups) -> None:
        self.cgroups = cgroups
        self._exits: dict[str, asyncio.Future[int | None]] = {}
        self._settling: dict[str, asyncio.Future[None]] = {}

    async def settled(self, machine_id: str) -> None:
        pending = self._settling.pop(machine_id, None)
        if pending is not None:
            await pending

    def _settle(self, machine_id: str, pid: int, cpus: int, memory_mb: int, setpriv: bool) -> None:
        self.cgroups.limit(machine_id, pid, cpus, memory_mb)
        if not setpriv or SETPRIV is None:
            return
        wrapper = os.path.realpath(SETPRIV)
        deadline = time.monotonic() + SETPRIV_WAIT
        while time.monotonic() < deadline:
            try:
                if os.readlink(f"/proc/{pid}/exe") != wrapper:
                    return
            except OSError:  # gone already: its exit is the monitor's to report
                return
            time.sleep(0.0005)

    async def prepare(self, launch: Launch) -> None:
        _workdir(launch).mkdir(parents=True, exist_ok=True)

    async def spawn(self, launch: Launch) -> Handle:
        if launch.resumed and (running := self.adopt(launch.machine_id, launch.marker, None)):
            return running
        workdir = _workdir(launch)
        workdir.mkdir(parents=True, exist_ok=True)
        env = machine_env(launch)
        argv, identity = _as_user(launch.config.argv(), launch.user, env, workdir)
        with _log(launch.rundir / "stdout.log") as out, _log(launch.rundir / "stderr.log") as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                    **identity,
                )
            except PermissionError as exc:
                if launch.user is None:
                    raise
                raise _not_for(launch.user, argv[-1], exc.errno or errno.EACCES) from exc
        guest = launch.config.guest
        # In a thread, awaited beside the spawn's commit (`settled`): moving a process into a
        # cgroup waits for the kernel (an RCU grace period) for as long as a commit takes.
        # Through setpriv, the process is itself only once setpriv has dropped to the app's
        # ids and run the command: it is not reported started before.
        self._settling[launch.machine_id] = asyncio.ensure_future(
            asyncio.to_thread(
                self._settle,
                launch.machine_id,
                proc.pid,
                guest.cpus,
                guest.memory_mb,
                argv[0] == SETPRIV,
            )
        )
        started = procfs.start_time(proc.pid) or "0"
        self._exits[launch.machine_id] = asyncio.ensure_future(proc.wait())
        return Handle(proc.pid, started)

    def adopt(self, machine_id: str, marker: str, handle: Handle | None) -> Handle | None:
        pending = self._exits.get(machine_id)
        if pending is not None and not pending.done() and handle is not None:
            return handle
        pid: int | None = None
        if (
            handle is not None
            and procfs.is_alive(handle.pid, handle.pid_start)
            and procfs.has_marker(handle.pid, marker)
        ):
            pid = handle.pid
        else:
            pid = procfs.find_by_marker(marker)
        if pid is None:
            return None
        start = procfs.start_time(pid)
        if start is None:
            return None
        found = Handle(pid, start)
        self._exits[machine_id] = asyncio.ensure_future(self._watch(found))
        return found

    async def _watch(self, handle: Handle) -> int | None:
        """A process that is not our child (adopted): its exit code is not ours to read."""
        await until_gone(handle, POLL)
        return None

    async def wait(self, machine_id: str) -> int | None:
        pending = self._exits.get(machine_id)
        if pending is None:
            return None
        return await asyncio.shield(pending)

    async def stop(
        self, machine_id: str, handle: Handle | None, signal: str, timeout: float
    ) -> None:
        if handle is not None and procfs.is_alive(handle.pid, handle.pid_start):
            await self._stop_leader(machine_id, handle, signal, timeout)
        await self._kill_remaining(machine_id, handle)

    def remaining(self, machine_id: str, handle: Handle | None) -> list[int]:
        pids = set(procfs.processes_of(machine_id)) | self.cgroups.pids(machine_id)
        if handle is not None and procfs.is_alive(handle.pid, handle.pid_start):
            pids.add(handle.pid)
        return sorted(pid for pid in pids if procfs.start_time(pid) is not None)

    async def _kill_remaining(self, machine_id: str, handle: Handle | None) -> None:
        """Once the machine's process is gone, what it left running (a child that ignores the
        signal, or one that left its process group) is killed, as a container's processes are
        with its init: nothing of a stopped machine runs on."""
        while left := self.remaining(machine_id, handle):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signals.SIGKILL)
            await asyncio.sleep(POLL)

    async def _stop_leader(
        self, machine_id: str, handle: Handle, signal: str, timeout: float
    ) -> None:
        pending = self._exits.get(machine_id)
        _killpg(handle.pid, signals.Signals[signal])
        try:
            if pending is not None:
                await asyncio.wait_for(asyncio.shield(pending), timeout)
            else:
                await asyncio.wait_for(poll_until_gone(handle, POLL), timeout)
            return
        except TimeoutError:
            pass
        _killpg(handle.pid, signals.SIGKILL)
        if pending is not None:
            await asyncio.shield(pending)
        else:
            await poll_until_gone(handle, POLL)

    async def cleanup(self, launch: Launch) -> None:
        self._exits.pop(launch.machine_id, None)
        self.cgroups.remove(launch.machine_id)
        if launch.home is not None:
            await asyncio.to_thread(shutil.rmtree, launch.home, True)


def _workdir(launch: Launch) -> Path:
    return launch.home or launch.rundir / "work"


SETPRIV = shutil.which("setpriv")  # util-linux


def _as_user(
    argv: list[str], user: HostUser | None, env: dict[str, str], cwd: Path
) -> tuple[list[str], dict[str, Any]]:
    """The command line and subprocess arguments that run `argv` as the app's user; nothing to
    drop unless the worker is root.

    Through `setpriv` when the host has it: Python forks the whole worker (no vfork) when asked
    to change ids itself, which costs tens of milliseconds on a worker of some size, against a
    few for a vfork and `setpriv`'s own setuid and exec. What that would refuse only at its own
    exec (a command not found, or not open to others) is refused here first, as before."""
    if user is None or os.geteuid() != 0:
        return argv, {}
    if SETPRIV is None:
        return argv, {"user": user.uid, "group": user.gid, "extra_groups": []}
    found = shutil.which(argv[0], path=env.get("PATH")) if "/" not in argv[0] else argv[0]
    if found is None or not (cwd / found).exists():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    if not _open_to_others(cwd / found):
        raise _not_for(user, argv[0], errno.EACCES)
    ids = [f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups"]
    return [SETPRIV, *ids, "--", *argv], {}


def _open_to_others(path: Path) -> bool:
    """Executable by others, and every directory above it searchable by them."""
    try:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        return all(os.stat(d).st_mode & stat.S_IXOTH for d in path.resolve().parents)
    except OSError:
        return False


def _not_for(user: HostUser, command: str, code: int) -> PermissionError:
    return PermissionError(
        code,
        f"the app's host user (uid {user.uid}) may not run {command}: it and every directory"
        " above it must be open to others",
    )


def _log(path: Path) -> IO[bytes]:
    """The worker's own file for the machine's output: the machine only gets its descriptor."""
    return open(path, "ab", opener=lambda name, flags: os.open(name, flags, 0o600))


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass

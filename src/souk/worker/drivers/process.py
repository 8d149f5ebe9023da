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
import os
import shutil
import signal as signals
from pathlib import Path
from typing import IO, Any

from souk.worker import procfs
from souk.worker.cgroups import Cgroups
from souk.worker.drivers.base import Handle, HostUser, Launch
from souk.worker.drivers.exits import poll_until_gone, until_gone

POLL = 0.05


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

    async def prepare(self, launch: Launch) -> None:
        _workdir(launch).mkdir(parents=True, exist_ok=True)

    async def spawn(self, launch: Launch) -> Handle:
        if launch.resumed and (running := self.adopt(launch.machine_id, launch.marker, None)):
            return running
        workdir = _workdir(launch)
        workdir.mkdir(parents=True, exist_ok=True)
        argv = launch.config.argv()
        with _log(launch.rundir / "stdout.log") as out, _log(launch.rundir / "stderr.log") as err:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    cwd=workdir,
                    env=machine_env(launch),
                    start_new_session=True,
                    **_identity(launch.user),
                )
            except PermissionError as exc:
                if launch.user is None:
                    raise
                raise PermissionError(
                    exc.errno,
                    f"the app's host user (uid {launch.user.uid}) may not run {argv[0]}: it and"
                    " every directory above it must be open to others",
                ) from exc
        guest = launch.config.guest
        # Off the spawn's path: run on the loop's next turn, while the spawn's commit is being
        # made durable (it finishes later: its result comes from the store's thread), so the
        # limits are in place before the machine is reported started.
        asyncio.get_running_loop().call_soon(
            self.cgroups.limit, launch.machine_id, proc.pid, guest.cpus, guest.memory_mb
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


def _identity(user: HostUser | None) -> dict[str, Any]:
    """What subprocess needs to start the process as the app's user; nothing to drop unless the
    worker is root."""
    if user is None or os.geteuid() != 0:
        return {}
    return {"user": user.uid, "group": user.gid, "extra_groups": []}


def _log(path: Path) -> IO[bytes]:
    """The worker's own file for the machine's output: the machine only gets its descriptor."""
    return open(path, "ab", opener=lambda name, flags: os.open(name, flags, 0o600))


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass

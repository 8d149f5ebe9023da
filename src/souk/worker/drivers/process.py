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
import json
import logging
import os
import shutil
import signal as signals
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from souk.models.machine import MachineProcess
from souk.worker.drivers import execs, launcher, processes
from souk.worker.drivers.base import ExecResult, Handle, Launch
from souk.worker.drivers.exits import child_exit, poll_until_gone, thaw_to_die, until_gone
from souk.worker.drivers.launcher import Network
from souk.worker.drivers.processes import SPEC_ENV
from souk.worker.drivers.spawner import Command, Spawner, TooLarge
from souk.worker.host import logs, procfs
from souk.worker.host.cgroups import Cgroups
from souk.worker.host.files import write_files
from souk.worker.host.identity import HostUser
from souk.worker.oci import network

POLL = 0.05
log = logging.getLogger("souk.worker.process")


def machine_env(launch: Launch) -> dict[str, str]:
    """What a machine sees: its config's env plus who and where it is."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(launch.home or launch.rundir),
        "LANG": "C.UTF-8",
    }
    env.update(launch.config.env)
    env.update(launch.identity_env())
    env["SOUK_MARKER"] = launch.marker
    if launch.volumes:  # a host process cannot have the volume at its path: it gets where it is
        env["SOUK_VOLUME_PATH"] = str(launch.volumes[0][1])
    return env


def _link_volumes(launch: Launch, workdir: Path) -> None:
    """A volume mounted at a one-part path also appears in the working directory under that
    name (`/data` is `./data`), so a command that opens `data/...` finds it without reading the
    env. Deeper paths get no link: the worker (root) would have to make directories inside the
    app's own, where a link the app left could lead it anywhere."""
    for path, directory in launch.volumes:
        name = path.strip("/")
        if not name or "/" in name:
            continue
        link = workdir / name
        if link.is_symlink():
            if link.readlink() == directory:
                continue
            link.unlink()  # removes the link itself, never what it points to
        elif link.exists():
            continue  # a file or directory of the app's own: left alone; the env still says
        link.symlink_to(directory)


class ProcessDriver:
    name = "process"

    def __init__(self, cgroups: Cgroups) -> None:
        self.cgroups = cgroups
        self._exits: dict[str, asyncio.Future[int | None]] = {}
        self._spawner: Spawner | None = None

    async def prepare(self, launch: Launch) -> str | None:
        workdir = _workdir(launch)
        workdir.mkdir(parents=True, exist_ok=True)
        if launch.config.files:  # relative to the working directory: no root of its own
            files, owner = launch.config.files, launch.file_owner()
            await asyncio.to_thread(write_files, workdir, files, launch.secrets, owner)
        if _networked(launch):
            await network.setup(launch.machine_id, launch.private_ip)
            network.resolv_conf(launch.rundir, launch.private_ip)
        return None

    async def spawn(self, launch: Launch) -> Handle:
        if launch.resumed and (running := self.adopt(launch.machine_id, launch.marker, None)):
            return running
        guest = launch.config.guest
        # Made on the loop: a thread to make them beside the rest cost more CPU than it saved.
        # The process joins them before its command runs (`launcher`).
        procs = self.cgroups.prepare(launch.machine_id, guest.cpus, guest.memory_mb)
        command = _command(launch)
        with logs.output_files(launch.rundir) as (out, err):
            try:
                pid, reap = await self._start(command, procs, out, err, _workdir(launch))
            except PermissionError as exc:
                if command.user is None:
                    raise
                raise _not_for(command.user, command.argv[0], exc.errno or errno.EACCES) from exc
        started = procfs.start_time(pid) or "0"
        # its exit read (and the process reaped) only once its start time is known
        self._exits[launch.machine_id] = asyncio.ensure_future(child_exit(pid, reap))
        return Handle(pid, started)

    async def _start(
        self, command: Command, procs: list[Path], out: IO[bytes], err: IO[bytes], cwd: Path
    ) -> tuple[int, Callable[[], int] | None]:
        """The pid, once what runs is the command, and how to reap it (None: waitpid): by the
        launcher's server where there is one (with no-new-privs even when there is nothing else
        to confine); else by `subprocess`, after a fork of the worker where Python confines it
        (`launcher.launching`), or through the launcher's command line for a request too large
        for its server."""
        if launcher.LAUNCHER is not None:
            if self._spawner is None:
                self._spawner = Spawner(launcher.LAUNCHER)
            output = (out.fileno(), err.fileno())
            try:
                return await self._spawner.spawn(command, cwd, output, procs), None
            except TooLarge as exc:
                log.info("%s: %s, started by souk-launch's command line", command.argv[0], exc)
        with launcher.launching(command.argv, command.user, procs, command.env) as start:
            proc = start.detached(out, err, cwd)
        return proc.pid, proc.wait

    async def close(self) -> None:
        if self._spawner is not None:
            await self._spawner.close()

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
        """A SIGKILL (or no time to act on a signal) kills every process of the machine at once,
        frozen or not; any other signal thaws it first, so that it can act on it."""
        if signal == "SIGKILL" or timeout <= 0:
            await self._kill_at_once(machine_id, handle)
            return
        await self.thaw(machine_id, handle)  # a frozen process cannot act on its signal
        if handle is not None and procfs.is_alive(handle.pid, handle.pid_start):
            await self._stop_leader(machine_id, handle, signal, timeout)
        await self._kill_remaining(machine_id, handle)

    async def _kill_at_once(self, machine_id: str, handle: Handle | None) -> None:
        """SIGKILL to each process while it may still be frozen, then the thaw: a process of a
        frozen v1 group cannot die until thawed, and then dies before running another
        instruction of its own."""
        if handle is not None and procfs.is_alive(handle.pid, handle.pid_start):
            _killpg(handle.pid, signals.SIGKILL)
        for pid in await self.remaining(machine_id, handle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signals.SIGKILL)
        await thaw_to_die(self.thaw, machine_id, handle)
        await self._kill_remaining(machine_id, handle)

    async def remaining(self, machine_id: str, handle: Handle | None) -> list[int]:
        """Read in a thread: each environment read reaches into another process's memory, a
        few microseconds each, and without cgroups every process of the host is read, which at
        a few thousand would hold every other request to this worker for tens of milliseconds
        at each stop."""
        return await asyncio.to_thread(self._remaining, machine_id, handle)

    def _remaining(self, machine_id: str, handle: Handle | None) -> list[int]:
        """The machine's groups hold its processes (its first joined them before its command
        ran). One whose groups could not be made, or that an earlier worker moved into them
        only once it ran, may have processes in the worker's own group: the marker is looked
        for among that group's processes alone, not among every machine's; without groups,
        among every process of the host."""
        among = self.cgroups.outside()
        pids = set(procfs.processes_of(machine_id, among)) | self.cgroups.pids(machine_id)
        if handle is not None and procfs.is_alive(handle.pid, handle.pid_start):
            pids.add(handle.pid)
        return sorted(pid for pid in pids if procfs.start_time(pid) is not None)

    async def _kill_remaining(self, machine_id: str, handle: Handle | None) -> None:
        """Once the machine's process is gone, what it left running (a child that ignores the
        signal, or one that left its process group) is killed, as a container's processes are
        with its init: nothing of a stopped machine runs on."""
        while left := await self.remaining(machine_id, handle):
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

    async def freeze(self, machine_id: str, handle: Handle | None) -> None:
        """The machine's freezer group, where the host has one (and the machine was started
        in it); else SIGSTOP to each of its processes, which the machine could tell."""
        if self.cgroups.can_freeze(machine_id):
            await self.cgroups.freeze(machine_id, True)
            return
        for pid in await self.remaining(machine_id, handle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signals.SIGSTOP)

    async def thaw(self, machine_id: str, handle: Handle | None) -> None:
        if self.cgroups.can_freeze(machine_id):
            await self.cgroups.freeze(machine_id, False)
            return
        for pid in await self.remaining(machine_id, handle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signals.SIGCONT)

    async def signal(self, machine_id: str, handle: Handle | None, signal: str) -> None:
        if handle is not None and procfs.is_alive(handle.pid, handle.pid_start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, signals.Signals[signal])

    async def exec(
        self, launch: Launch, handle: Handle | None, argv: list[str], stdin: bytes, timeout: float
    ) -> ExecResult:
        """As the machine runs: its environment (without the marker that tells its main
        process apart), its user, its directory, its cgroups (`launcher`)."""
        env = machine_env(launch)
        env.pop("SOUK_MARKER", None)
        procs = self.cgroups.procs_files(launch.machine_id)
        try:
            with launcher.launching(argv, launch.user, procs, env, _network(launch)) as start:
                return await execs.run(
                    start.argv, stdin, timeout, cwd=_workdir(launch), **start.popen
                )
        except (FileNotFoundError, PermissionError) as exc:  # as a shell answers them
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            return ExecResult(b"", f"{argv[0]}: {exc.strerror}\n".encode(), code)

    async def processes(self, machine_id: str, handle: Handle | None) -> list[int]:
        return await self.remaining(machine_id, handle)

    async def cleanup(self, launch: Launch) -> None:
        self._exits.pop(launch.machine_id, None)
        self.cgroups.remove(launch.machine_id)
        await network.teardown(launch.machine_id)
        if launch.home is not None:
            await asyncio.to_thread(shutil.rmtree, launch.home, True)


def _command(launch: Launch) -> Command:
    """What the spawn runs, in what environment, as which user, in a working directory made
    ready for it."""
    workdir = _workdir(launch)
    workdir.mkdir(parents=True, exist_ok=True)
    _link_volumes(launch, workdir)
    env = machine_env(launch)
    if launch.config.processes:
        return _supervisor(launch, env)
    argv = launch.config.argv()
    path = _found(argv[0], env, workdir)
    if launch.user is not None and not _open_to_others(workdir / path):  # a root worker's
        raise _not_for(launch.user, argv[0], errno.EACCES)
    return Command(path, argv, env, launch.user, _network(launch))


def _networked(launch: Launch) -> bool:
    """A machine on the private network (an IPv6 address) has a network namespace of its own;
    one with a loopback address (a worker that is not root) shares the host's."""
    return ":" in launch.private_ip


def _network(launch: Launch) -> Network | None:
    if not _networked(launch):
        return None
    return Network(network.path_of(launch.machine_id), _resolv(launch))


def _resolv(launch: Launch) -> Path:
    """The machine's /etc/resolv.conf (`network.resolv_conf`), mounted over the host's."""
    return launch.rundir / "resolv.conf"


def _supervisor(launch: Launch, env: dict[str, str]) -> Command:
    """What starts a machine's `processes`: `souk-launch --processes`, which starts each as its
    own ids (it stays root on a root worker, and runs nothing of the machine's itself: what the
    machine chose is in its environment under its own names only); else `processes.py`, a
    standard-library script run as the app's user, which can give no process other ids."""
    specs = process_specs(launch, ids=launcher.LAUNCHER is not None)
    if launcher.LAUNCHER is None:
        argv = [sys.executable, "-I", processes.__file__]  # stdlib only: runs as a file
        spec_env = {**env, SPEC_ENV: json.dumps(specs)}
        return Command(argv[0], argv, spec_env, launch.user, _network(launch))
    handed = {  # its own: how the worker finds it (`procfs`), and what it starts
        "SOUK_MACHINE_ID": launch.machine_id,
        "SOUK_MARKER": launch.marker,
        "SOUK_PROCESSES": str(len(specs)),
    }
    for i, spec in enumerate(specs):
        ids = f":{spec['uid']}:{spec['gid']}" if spec["uid"] is not None else ""
        handed[f"SOUK_PROCESS{i}"] = f"{len(spec['argv'])}:{len(spec['env'])}{ids}"
        handed.update(launcher.numbered(f"SOUK_PROCESS{i}_ARG", spec["argv"]))
        pairs = [f"{name}={value}" for name, value in spec["env"].items()]
        handed.update(launcher.numbered(f"SOUK_PROCESS{i}_ENV", pairs))
    argv = [launcher.LAUNCHER, "--processes"]
    return Command(launcher.LAUNCHER, argv, handed, None, _network(launch))


def process_env(
    launch: Launch, process: MachineProcess, base: dict[str, str] | None = None
) -> dict[str, str]:
    """A process's env: the machine's (`base`, else as a host command gets it; without the
    app's secrets if it ignores them), then its own, then its `env_from` fields."""
    fields = {
        "id": launch.machine_id,
        "version": launch.instance_id,
        "app_name": launch.app,
        "private_ip": launch.private_ip,
        "region": launch.region,
        "image": launch.config.image or "",
    }
    env = dict(base) if base is not None else machine_env(launch)
    if process.ignore_app_secrets:
        for name in launch.secrets:
            env.pop(name, None)
    env.update(process.env)
    env.update({ref.env_var: fields[ref.field_ref] for ref in process.env_from})
    return env


def process_specs(launch: Launch, ids: bool = True) -> list[dict[str, Any]]:
    """What the supervisor starts: each process's argv, env and host ids (the app's own, offset
    by its `user` within the app's span; none for a worker that is not root, nor where the
    supervisor is not to give ids: `ids` False, and then only the app's own id may be asked)."""
    specs = []
    for process in launch.config.processes:
        uid = gid = None
        if launch.user is not None and os.geteuid() == 0:
            offset = process.uid_offset()
            if offset >= launch.user.span:
                raise PermissionError(
                    f"user {process.user}: outside the app's {launch.user.span} ids"
                )
            if offset and not ids:
                raise PermissionError(
                    f"user {process.user}: another of the app's ids needs souk-launch"
                    " (scripts/setup.sh builds it)"
                )
            if ids:
                uid, gid = launch.user.uid + offset, launch.user.gid + offset
        argv = process.argv(launch.config.init)
        specs.append({"argv": argv, "env": process_env(launch, process), "uid": uid, "gid": gid})
    return specs


def _workdir(launch: Launch) -> Path:
    return launch.home or launch.rundir / "work"


def _found(command: str, env: dict[str, str], cwd: Path) -> str:
    """`command` as exec finds it, in the env's PATH unless it names a path; refused here, as
    Python's own spawn would, if there is none."""
    found = shutil.which(command, path=env.get("PATH")) if "/" not in command else command
    if found is None or not (cwd / found).exists():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
    return found


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


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass

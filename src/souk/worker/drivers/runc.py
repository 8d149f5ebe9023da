"""The runc driver: a machine is an OCI container run by `runc` from its image.

Each spawn runs `runc run` (foreground) under a small shim (`souk-launch --exit-to`, or a shell)
in a session of its own, with output going to files: the shim and the container survive a worker
crash, and the shim records the container's exit code in the machine's directory, where a
restarted worker reads it. A spawn returns once runc has written the container's pid file
(watched on inotify: `file_appears.py`). The container's annotations carry the spawn's marker,
which is how adoption recognises it."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shlex
import shutil
import signal as signals
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from souk.worker.drivers import execs, launcher
from souk.worker.drivers.base import ExecResult, Handle, Launch
from souk.worker.drivers.exits import (
    ExitCodes,
    child_exit,
    poll_until_gone,
    thaw_to_die,
    until_gone,
)
from souk.worker.drivers.file_appears import FileWatch
from souk.worker.machines import logs, procfs
from souk.worker.machines.cgroups import Cgroups
from souk.worker.machines.files import write_files
from souk.worker.oci import network
from souk.worker.oci.images import Image, ImageCache
from souk.worker.oci.spec import runtime_spec

POLL = 0.02
MARKER = "souk.marker"
IMAGE = "souk.image"  # the digest of the image a bundle was prepared from
_libc = ctypes.CDLL(None, use_errno=True)


class RuncError(RuntimeError):
    pass


class RuncDriver:
    name = "runc"

    def __init__(self, images: ImageCache, state_dir: Path, cgroup_parent: str = "souk") -> None:
        """`state_dir` is runc's own state root (`runc --root`), kept with the worker's data so
        that several workers on one host never see each other's containers."""
        runc = shutil.which("runc")
        if not runc:
            raise RuncError("runc is not installed")
        self.runc = runc
        self.images = images
        self.state_dir = state_dir
        self.cgroup_parent = cgroup_parent
        # the containers' cgroups, `/<cgroup_parent>/<machine id>` (as their runtime specs say)
        self.freezer = Cgroups(cgroup_parent)
        self._exits = ExitCodes()
        self._files = FileWatch()  # for runc's pid file

    @staticmethod
    def container_id(machine_id: str) -> str:
        return f"souk-{machine_id}"

    async def _runc(self, *args: str, check: bool = True) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.runc,
            "--root",
            str(self.state_dir),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        if check and proc.returncode != 0:
            raise RuncError(f"runc {' '.join(args)}: {err.decode().strip()}")
        return out.decode()

    async def state(self, machine_id: str) -> dict[str, Any] | None:
        out = await self._runc("state", self.container_id(machine_id), check=False)
        try:
            found = json.loads(out)
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    # -- the driver interface --------------------------------------------------------------

    async def prepare(self, launch: Launch) -> str | None:
        if not launch.config.image:
            raise RuncError("the runc driver runs images; this machine names none")
        reference = launch.config.image
        # A start resumed after a crash runs what its first try prepared (and may have started):
        # asked again, the tag may name another image by now.
        digest = launch.image_digest or _prepared(launch)

        async def root() -> tuple[Image, Path]:
            image = await self.images.pull(reference, digest)
            return image, await self.images.prepare_rootfs(image, _image_dir(launch), launch.user)

        # The network is independent of the image: both are made at once. Both end before a
        # failure of either is raised, and `cleanup` undoes whatever exists.
        made, net = await asyncio.gather(
            root(), network.setup(launch.machine_id, launch.private_ip), return_exceptions=True
        )
        if isinstance(made, BaseException):
            raise made
        if isinstance(net, BaseException):
            raise net
        (image, rootfs), netns = made, net
        if launch.config.files:
            files, owner = launch.config.files, launch.file_owner()
            await asyncio.to_thread(write_files, rootfs, files, launch.secrets, owner)
        spec = runtime_spec(
            image.config,
            launch.config,
            rootfs.resolve(),
            hostname=launch.machine_id,
            extra_env=launch.identity_env(),
            netns=netns,
            cgroup=f"/{self.cgroup_parent}/{launch.machine_id}",
            annotations={MARKER: launch.marker, IMAGE: image.digest},
            user=launch.user,
            volumes=(*launch.volumes, *_resolver(launch)),
        )
        bundle = launch.rundir / "bundle"
        bundle.mkdir(mode=0o700, parents=True, exist_ok=True)
        # No indent: json's C encoder only writes without one (the pure-Python one took ~0.5 ms)
        _write_private(bundle / "config.json", json.dumps(spec).encode())
        return image.digest

    async def spawn(self, launch: Launch) -> Handle:
        cid = self.container_id(launch.machine_id)
        if (self.state_dir / cid).exists():  # runc knows it: running (adopt) or an earlier run
            running = await self._adopt(launch.machine_id, launch.marker)
            if running is not None:
                return running
            await self._runc("delete", "--force", cid, check=False)
        if not (launch.rundir / "bundle" / "config.json").exists():
            await self.prepare(launch)
        exit_file, pid_file = launch.rundir / "exit_code", launch.rundir / "container.pid"
        exit_file.unlink(missing_ok=True)
        pid_file.unlink(missing_ok=True)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        run = [self.runc, "--root", str(self.state_dir), "run", "--bundle", "bundle"]
        run += ["--pid-file", pid_file.name, cid]
        with logs.output_files(launch.rundir) as (out, err), _inside(launch) as (prefix, popen):
            # Popen itself, without asyncio's child watcher (a thread per process): the exit is
            # read on a pidfd (`child_exit`).
            shim = subprocess.Popen(  # noqa: ASYNC220
                _shim(run, prefix),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=launch.rundir,
                start_new_session=True,
                **popen,
            )
        exited = asyncio.ensure_future(child_exit(shim.pid, shim.wait))
        if not await self._files.appears(pid_file, exited):  # written once the container runs
            raise RuncError(f"runc failed to start {cid}: see {launch.rundir}/stderr.log")
        pid = int(pid_file.read_text().strip())
        pid_file.chmod(0o600)  # runc's, with the umask's mode
        handle = Handle(pid, procfs.start_time(pid) or "0")
        self._exits.expect(launch.machine_id, self._exit_code(exited, launch.rundir / "exit_code"))
        return handle

    async def _exit_code(self, done: asyncio.Future[Any], exit_file: Path) -> int | None:
        await done
        for _ in range(100):  # the shim writes it right after runc returns
            if exit_file.exists():
                text = exit_file.read_text().strip()
                return int(text) if text.isdigit() else None
            await asyncio.sleep(POLL)
        return None

    def adopt(self, machine_id: str, marker: str, handle: Handle | None) -> Handle | None:
        """Synchronous part of adoption: a container this driver instance is already watching."""
        if handle is not None and self._exits.watching(machine_id):
            return handle
        if handle is None or not procfs.is_alive(handle.pid, handle.pid_start):
            return None
        annotations = self._annotations(machine_id)
        if annotations.get(MARKER) != marker:
            return None
        rundir = self._rundir_of(machine_id)  # now: `runc run` deletes its state on exit
        self._exits.expect(machine_id, self._watch(handle, rundir))
        return handle

    def _annotations(self, machine_id: str) -> dict[str, str]:
        """From runc's state file (the synchronous `adopt` cannot run `runc state`)."""
        path = self.state_dir / self.container_id(machine_id) / "state.json"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        found = state.get("config", {}).get("labels", [])
        pairs = (item.partition("=") for item in found if isinstance(item, str))
        return {k: v for k, _, v in pairs}

    async def _adopt(self, machine_id: str, marker: str) -> Handle | None:
        state = await self.state(machine_id)
        if not state or state.get("status") != "running" or not state.get("pid"):
            return None
        if (state.get("annotations") or {}).get(MARKER) != marker:
            return None
        pid = int(state["pid"])
        handle = Handle(pid, procfs.start_time(pid) or "0")
        return self.adopt(machine_id, marker, handle)

    async def _watch(self, handle: Handle, rundir: Path | None) -> int | None:
        """Wait for a container we did not start: its init's exit, then the shim's record."""
        await until_gone(handle, POLL)
        if rundir is None:
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return await self._exit_code(done, rundir / "exit_code")

    def _rundir_of(self, machine_id: str) -> Path | None:
        bundle = self._annotations(machine_id).get("bundle")  # runc's label: <rundir>/bundle
        return Path(bundle).parent if bundle else None

    async def wait(self, machine_id: str) -> int | None:
        return await self._exits.wait(machine_id)

    async def stop(
        self, machine_id: str, handle: Handle | None, signal: str, timeout: float
    ) -> None:
        """A SIGKILL (or no time to act on a signal) kills the container at once, paused or
        not, whether or not its start was recorded; any other signal resumes it first."""
        if signal == "SIGKILL" or timeout <= 0:
            await self._kill_at_once(machine_id, handle)
            return
        if handle is None or not procfs.is_alive(handle.pid, handle.pid_start):
            return
        cid = self.container_id(machine_id)
        await self.thaw(machine_id, handle)  # a paused container cannot act on its signal
        await self._runc("kill", cid, str(signals.Signals[signal].value), check=False)
        try:
            await asyncio.wait_for(self._gone(machine_id, handle), timeout)
            return
        except TimeoutError:
            pass
        await self._kill_at_once(machine_id, handle)

    async def _kill_at_once(self, machine_id: str, handle: Handle | None) -> None:
        """SIGKILL to every process in the container's cgroup (what `runc kill --all` does,
        without a runc run for each), then the thaw, which lets a frozen one die; until none
        is left."""
        delay = POLL
        while left := await self.remaining(machine_id, handle):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signals.SIGKILL)
            await thaw_to_die(self.thaw, machine_id, handle)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        if handle is not None:
            await self._exits.wait(machine_id)

    async def remaining(self, machine_id: str, handle: Handle | None) -> list[int]:
        """The container's processes, from its cgroup: also those of a start that was cut
        short before its pid was recorded."""
        pids = self.freezer.pids(machine_id)
        if handle is not None and procfs.is_alive(handle.pid, handle.pid_start):
            pids.add(handle.pid)
        return sorted(pid for pid in pids if procfs.start_time(pid) is not None)

    async def _gone(self, machine_id: str, handle: Handle) -> None:
        await self._exits.wait(machine_id)
        await poll_until_gone(handle, POLL)

    async def freeze(self, machine_id: str, handle: Handle | None) -> None:
        """The container's freezer group, written directly where the worker can (what `runc
        pause` does, and what `runc state` reads back: runc keeps no state of its own about
        it), which spares two runc runs; else `runc pause`."""
        if self.freezer.can_freeze(machine_id):
            await self.freezer.freeze(machine_id, True)
            return
        state = await self.state(machine_id)
        if state is not None and state.get("status") == "running":
            await self._runc("pause", self.container_id(machine_id))

    async def thaw(self, machine_id: str, handle: Handle | None) -> None:
        if self.freezer.can_freeze(machine_id):
            await self.freezer.freeze(machine_id, False)
            return
        state = await self.state(machine_id)
        if state is not None and state.get("status") == "paused":
            await self._runc("resume", self.container_id(machine_id))

    async def signal(self, machine_id: str, handle: Handle | None, signal: str) -> None:
        if handle is not None and procfs.is_alive(handle.pid, handle.pid_start):
            cid = self.container_id(machine_id)
            await self._runc("kill", cid, str(signals.Signals[signal].value), check=False)

    async def exec(
        self, launch: Launch, handle: Handle | None, argv: list[str], stdin: bytes, timeout: float
    ) -> ExecResult:
        """`runc exec`, run inside the machine's network namespace as the container itself is
        (`_inside`): the container's other namespaces, cgroup, user, environment and working
        directory, all from its runtime spec. On timeout runc is sent SIGTERM, which it passes
        on to the command, then SIGKILL."""
        cid = self.container_id(launch.machine_id)
        runc = [self.runc, "--root", str(self.state_dir), "exec", cid, *argv]
        with _inside(launch) as (prefix, popen):
            runs = [*prefix, "--", *runc] if prefix else runc
            return await execs.run(runs, stdin, timeout, on_timeout=signals.SIGTERM, **popen)

    async def processes(self, machine_id: str, handle: Handle | None) -> list[int]:
        out = await self._runc("ps", "--format", "json", self.container_id(machine_id), check=False)
        try:
            pids = json.loads(out or "[]")
        except ValueError:
            return await self.remaining(machine_id, handle)
        return [int(p) for p in pids or [] if isinstance(p, int)]

    async def close(self) -> None:
        self._files.close()

    async def cleanup(self, launch: Launch) -> None:
        self._exits.pop(launch.machine_id)
        await self._runc("delete", "--force", self.container_id(launch.machine_id), check=False)
        await network.teardown(launch.machine_id)
        await self.images.release_rootfs(_image_dir(launch))
        if launch.home is not None:
            await asyncio.to_thread(shutil.rmtree, launch.home, True)


def _resolver(launch: Launch) -> tuple[tuple[str, Path], ...]:
    """A machine on the private network asks its worker's DNS (docs/network.md): its
    resolv.conf mounted over the image's."""
    if ":" not in launch.private_ip:
        return ()
    return (("/etc/resolv.conf", network.resolv_conf(launch.rundir, launch.private_ip)),)


@contextlib.contextmanager
def _inside(launch: Launch) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """How runc runs inside the machine's network namespace, which the runtime spec does not
    name (`runtime_spec`): souk-launch's `--netns` (the command-line prefix, with the Popen
    arguments that hand it the namespace), or without it a `preexec_fn` joining it (a fork of
    the worker). Joined while still the host's root: `runc exec` joins the container's user
    namespace first, which has no rights over a namespace the worker made."""
    fd = os.open(network.path_of(launch.machine_id), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if launcher.LAUNCHER is not None:
            yield [launcher.LAUNCHER, "--netns", str(fd)], {"pass_fds": (fd,)}
        else:
            yield [], {"preexec_fn": _joiner(fd)}
    finally:
        os.close(fd)


def _joiner(fd: int) -> Callable[[], None]:
    def join() -> None:  # in the child, before its exec
        if _libc.setns(fd, network.CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "joining the machine's network namespace")

    return join


def _shim(run: list[str], prefix: list[str]) -> list[str]:
    """What runs `runc run` and then records its exit code in `exit_code`: souk-launch
    (`--exit-to`, a static program, after `prefix`), or a shell where there is none (0.8 ms
    more before runc starts, here)."""
    if launcher.LAUNCHER is not None:
        return [*prefix, "--exit-to", "exit_code", "--", *run]
    script = f"{shlex.join(run)}; echo $? > exit_code.tmp; mv -f exit_code.tmp exit_code"
    return [shutil.which("sh") or "sh", "-c", script]


def _prepared(launch: Launch) -> str | None:
    """The image digest this very start (its marker) prepared its bundle with, if it did."""
    if not launch.resumed:
        return None
    try:
        spec = json.loads((launch.rundir / "bundle" / "config.json").read_bytes())
        annotations = spec["annotations"]
        if annotations[MARKER] == launch.marker and isinstance(annotations[IMAGE], str):
            return str(annotations[IMAGE])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _image_dir(launch: Launch) -> Path:
    """Where the root filesystem goes: below the app's directory, which the container's root
    must be able to walk to in a user namespace."""
    return (launch.home or launch.rundir) / "image"


def _write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, readable by root alone from the start: a runtime spec holds
    the machine's environment, secrets included."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # an earlier try's, maybe with looser bits
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)

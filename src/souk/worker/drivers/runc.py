"""The runc driver: a machine is an OCI container run by `runc` from its image.

Each spawn runs `runc run` (foreground) under a small shim (`souk-launch --exit-to`, or a shell)
in a session of its own, with output going to files: the shim and the container survive a worker
crash, and the shim records the container's exit code in the machine's directory, where a
restarted worker reads it. A spawn returns once runc has written the container's pid file
(watched on inotify: `file_appears.py`). The container's annotations carry the spawn's marker,
which is how adoption recognises it.

The container's PID 1 is `souk-init --container` (`init/`, also the vm driver's guest init),
bind-mounted read-only from the host at `/.souk/init`: it starts the image's command or the
config's `processes` (each restarted by its own policy), reaps orphans, passes the stop signal
to every process and exits with the code of the first process to end for good. Its config (the
processes' argv, ids, directory, env and restart) comes on its stdin from a private file of the
bundle. It runs as the image's process would have (user, capabilities), unless some process
runs as other ids: then as the container's root, with what giving ids takes. `exec` stays
`runc exec`, with the process the spec had before souk-init took its place; `signal` goes to
the processes, not to souk-init, for which any signal means stop. Without souk-init built, the
image's command is PID 1 and `processes` are refused."""

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

from souk.commands import completed
from souk.models.machine import InitConfig, MachineConfig, MachineProcess
from souk.worker.drivers import execs, launcher, vm_boot, vm_channel
from souk.worker.drivers.base import ExecResult, Handle, Launch
from souk.worker.drivers.exits import (
    ExitCodes,
    child_exit,
    poll_until_gone,
    thaw_to_die,
    until_gone,
)
from souk.worker.drivers.file_appears import FileWatch
from souk.worker.drivers.process import process_env
from souk.worker.host import logs, procfs
from souk.worker.host.cgroups import Cgroups
from souk.worker.host.files import write_files
from souk.worker.host.identity import HostUser
from souk.worker.oci import network
from souk.worker.oci.config import ImageConfig
from souk.worker.oci.images import Image, ImageCache
from souk.worker.oci.spec import resolve_user, runtime_spec

POLL = 0.02
MARKER = "souk.marker"
IMAGE = "souk.image"  # the digest of the image a bundle was prepared from
INIT_PATH = "/.souk/init"  # where souk-init is mounted in the container
# What souk-init needs beyond the container's capabilities to give each process its ids; it
# takes them out of each process's bounding set before its exec (`drop_init_caps`).
INIT_CAPS = ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]
INIT_CONFIG = "init.conf"  # souk-init's config, beside the runtime spec: its stdin
EXEC_PROCESS = "process.json"  # the process `runc exec` starts from (the image's, not init's)
_libc = ctypes.CDLL(None, use_errno=True)


class RuncError(RuntimeError):
    pass


class RuncDriver:
    name = "runc"

    def __init__(
        self,
        images: ImageCache,
        state_dir: Path,
        cgroup_parent: str = "souk",
        use_init: bool = True,
    ) -> None:
        """`state_dir` is runc's own state root (`runc --root`), kept with the worker's data so
        that several workers on one host never see each other's containers. `use_init` False
        runs the image's command as PID 1, as where souk-init is not built."""
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
        self.init = vm_boot.find_init() if use_init else None

    @property
    def runs_processes(self) -> bool:
        """`processes` of an image machine: souk-init, PID 1 of the container, runs them."""
        return self.init is not None

    @staticmethod
    def container_id(machine_id: str) -> str:
        return f"souk-{machine_id}"

    async def _runc(self, *args: str, check: bool = True) -> str:
        done = await completed(self.runc, "--root", str(self.state_dir), *args)
        if check and done.failed:
            raise RuncError(f"runc {' '.join(args)}: {done.err.decode().strip()}")
        return done.out.decode()

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
        # With souk-init, the image's command is only in its config: the processes may have
        # their own and the image none.
        init_exec = InitConfig(exec=[INIT_PATH, "--container"])
        config = launch.config.model_copy(update={"init": init_exec}) if self.init else None
        spec = runtime_spec(
            image.config,
            config or launch.config,
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
        if self.init is not None:
            ids, init_config = _init_config(launch, image.config, rootfs, spec["process"]["env"])
            _write_private(bundle / EXEC_PROCESS, json.dumps(spec["process"]).encode())
            _write_private(bundle / INIT_CONFIG, init_config)
            spec = _with_init(spec, self.init, ids)
        elif launch.config.processes:
            raise RuncError("processes of an image need souk-init: see scripts/setup.sh")
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
        with (
            logs.output_files(launch.rundir) as (out, err),
            _inside(launch) as (prefix, popen),
            _init_input(launch.rundir / "bundle") as stdin,
        ):
            # Popen itself, without asyncio's child watcher (a thread per process): the exit is
            # read on a pidfd (`child_exit`).
            shim = subprocess.Popen(  # noqa: ASYNC220
                _shim(run, prefix),
                stdin=stdin,
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
        """To PID 1 where it is the machine's command; where it is souk-init, to each of its
        children's process groups (its processes, each a session of its own, and orphans it
        adopted) from the host: a signal souk-init itself gets means the machine stops."""
        if handle is None or not procfs.is_alive(handle.pid, handle.pid_start):
            return
        number = signals.Signals[signal].value
        if (procfs.arguments(handle.pid) or [])[:2] == [INIT_PATH.encode(), b"--container"]:
            for child in procfs.children(handle.pid):
                with contextlib.suppress(ProcessLookupError):
                    try:
                        os.killpg(child, number)
                    except ProcessLookupError:  # not a group's leader: an orphan
                        os.kill(child, number)
            return
        cid = self.container_id(machine_id)
        await self._runc("kill", cid, str(number), check=False)

    async def exec(
        self, launch: Launch, handle: Handle | None, argv: list[str], stdin: bytes, timeout: float
    ) -> ExecResult:
        """`runc exec`, run inside the machine's network namespace as the container itself is
        (`_inside`): the container's other namespaces, cgroup, user, environment and working
        directory, all from its runtime spec: the process souk-init replaced there, where it
        did. On timeout runc is sent SIGTERM, which it passes on to the command, then SIGKILL."""
        cid = self.container_id(launch.machine_id)
        runc = [self.runc, "--root", str(self.state_dir), "exec"]
        process = _exec_process(launch.rundir / "bundle", argv)
        runc += ["--process", str(process), cid] if process else [cid, *argv]
        try:
            with _inside(launch) as (prefix, popen):
                runs = [*prefix, "--", *runc] if prefix else runc
                return await execs.run(runs, stdin, timeout, on_timeout=signals.SIGTERM, **popen)
        finally:
            if process is not None:
                process.unlink(missing_ok=True)

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


def restart_of(process: MachineProcess | None, config: MachineConfig) -> str:
    """A process's restart policy as souk-init reads it: its own, else the machine's; the
    image's command (no `processes`) is restarted by the worker, with the whole machine."""
    if process is None:
        return "no"
    restart = process.restart or config.restart
    if restart.policy == "on-failure":
        return f"on-failure:{restart.max_retries}"
    return restart.policy


def _init_config(
    launch: Launch, image: ImageConfig, rootfs: Path, env: list[str]
) -> tuple[bool, bytes]:
    """souk-init's config (a 'C' frame, as the guest's, without the guest's own parts): for
    each process its restart, ids (the image's user, or the app's id + n a process's `user`
    asks for), working directory, argv and env. With whether some process runs as other ids
    than the image's user (souk-init must then be able to give them)."""
    uid, gid = resolve_user(image.user, rootfs)
    machine_env = dict(e.partition("=")[::2] for e in env)
    cwd = image.workdir or "/"
    pairs: list[tuple[str, str]] = []
    others = False
    processes: list[MachineProcess | None] = [*launch.config.processes] or [None]
    for process in processes:
        own = process.argv(launch.config.init) if process is not None else []
        argv = own or image.argv(launch.config.init)
        if not argv:
            raise ValueError("the image names no command and the machine config gives none")
        ids, penv = f"{uid}:{gid}", env
        if process is not None:
            if process.user:
                offset = process.uid_offset()
                _within(launch.user, offset, process.user)
                ids = f"{offset}:{offset}"
                others = others or (offset, offset) != (uid, gid)
            penv = [f"{k}={v}" for k, v in process_env(launch, process, machine_env).items()]
        pairs += [("proc", restart_of(process, launch.config)), ("ids", ids), ("cwd", cwd)]
        pairs += [("arg", a) for a in argv]
        pairs += [("penv", e) for e in penv]
    return others, vm_channel.frame(b"C", 0, (x.encode() for pair in pairs for x in pair))


def _within(user: HostUser | None, offset: int, asked: str) -> None:
    if user is not None and offset >= user.span:
        raise PermissionError(f"user {asked}: outside the app's {user.span} ids")


def _with_init(spec: dict[str, Any], init: Path, ids: bool) -> dict[str, Any]:
    """The spec with souk-init as its process, mounted read-only from the host. As the image's
    process would have run; with `ids` (processes of other ids), as the container's root with
    the capabilities that giving ids takes."""
    # none of the machine's env: souk-init hands each process its own, and reads no variable
    process = {**spec["process"], "args": [INIT_PATH, "--container"], "env": []}
    if ids:
        caps = process["capabilities"]
        process["capabilities"] = {kind: [*found, *INIT_CAPS] for kind, found in caps.items()}
        process["user"] = {"uid": 0, "gid": 0}
    mount = {
        "destination": INIT_PATH,
        "type": "none",
        "source": str(init),
        "options": ["bind", "ro", "nosuid", "nodev"],
    }
    return {**spec, "process": process, "mounts": [*spec["mounts"], mount]}


@contextlib.contextmanager
def _init_input(bundle: Path) -> Iterator[int]:
    """The shim's stdin: souk-init's config where the bundle has one (runc copies its stdin
    into the container's), else nothing."""
    try:
        fd = os.open(bundle / INIT_CONFIG, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield subprocess.DEVNULL
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _exec_process(bundle: Path, argv: list[str]) -> Path | None:
    """A process file for `runc exec` running `argv` as the image's process would have run
    (its user, env, directory, capabilities), where souk-init took that process's place."""
    try:
        process = json.loads((bundle / EXEC_PROCESS).read_bytes())
    except FileNotFoundError:
        return None
    path = bundle / f"exec-{os.urandom(6).hex()}.json"
    _write_private(path, json.dumps({**process, "args": argv}).encode())
    return path


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

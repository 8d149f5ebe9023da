"""The vm driver: an image machine is a qemu guest with a kernel of its own.

Each spawn runs qemu under the runc driver's shim (which records its exit code in the machine's
directory) in the machine's cgroups and network namespace, qemu dropping to the app's host user
once it has opened its files and devices, inside its own sandbox (`-sandbox on`: no new
privileges, no programs run, no resource changes). `microvm` with KVM where a probe guest boots
under KVM; `q35` with TCG (emulation) otherwise. The guest boots the host's kernel package with
an initramfs the worker builds (`vm_boot.py`), whose /init is `souk-init` (`init/`): it gets
the machine's config (`vm_guest.py`) over a virtio-serial port (`vm_channel.py`), never on the
kernel command line, and answers `exec`, signals and `ps` over it.

The root disk is the image made into ext4 once per digest, shared read-only, under a qcow2 layer
of the machine's own (`vm_rootfs.py`); volumes are further disks, lent by the host while the
guest runs (`vm_volumes.py`). The network is the runc machines' namespace and addresses
(`oci/network.py`): in the namespace a tap device, joined to the namespace's eth0 by two tc
redirects (what arrives on one leaves by the other), so the guest holds the machine's private
address and IPv4 address itself, and the host's isolation rules apply to it unchanged. Its
stdout and stderr are the guest's two virtio consoles, written by qemu to the machine's log
files; the kernel's own console goes to `console.log` beside them.

A worker restarted after a crash finds each guest by qemu's pid file and the spawn's marker in
qemu's environment, and reconnects to its channel. Suspend pauses the guest through the monitor
(`vm_qmp.py`), saves its memory to `memory.snap` and frees it (`vm_memory.py`); resume writes it
back and lets the guest run on, in the same qemu."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal as signals
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from souk.worker.drivers import (
    launcher,
    vm_boot,
    vm_guest,
    vm_memory,
    vm_qmp,
    vm_rootfs,
    vm_volumes,
)
from souk.worker.drivers.base import ExecResult, ExecTimeout, Handle, Launch
from souk.worker.drivers.exits import ExitCodes, child_exit, poll_until_gone, until_gone
from souk.worker.drivers.file_appears import FileWatch
from souk.worker.drivers.runc import _shim
from souk.worker.drivers.vm_channel import Channel, ChannelClosed
from souk.worker.host import logs, procfs
from souk.worker.host.cgroups import Cgroups
from souk.worker.oci import network
from souk.worker.oci.images import Image, ImageCache
from souk.worker.oci.spec import resolve_user
from souk.worker.volumes import disk as volume_disk

log = logging.getLogger("souk.worker.vm")
POLL = 0.05
BOOT_SECONDS = 300.0  # to the guest init's `started`: emulation on a busy host is slow
KILL_GRACE = 10.0  # for a guest told to kill its processes to sync and power off
OVERHEAD_MB = 160  # qemu's own memory beside the guest's, in the machine's cgroup
TCG_CACHE_MB = 64  # TCG's translation cache (its default is a gigabyte)
DEBUG_EXIT = "isa-debug-exit,iobase=0xf4,iosize=0x04"
# qemu's seccomp filter, in place before qemu drops to the app's user (`-runas`), which is why it
# allows the set*id calls: that drop is one of them, and after it no privileged id is left to
# take. Everything else of qemu's sandbox is on.
SANDBOX = "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny"
STATE = "vm.json"  # the spawn's marker and image, beside qemu's files
SNAPSHOT = "memory.snap"  # a suspended guest's memory


class VmError(RuntimeError):
    pass


@dataclass(frozen=True)
class Guest:
    """What a guest boots, found once per worker."""

    kernel: vm_boot.Kernel
    initramfs: Path
    accel: vm_boot.Accel


class VmDriver:
    name = "vm"
    runs_processes = True  # `processes` of an image machine: its guest init runs them

    def __init__(self, images: ImageCache, cgroups: Cgroups, accel: vm_boot.Accel) -> None:
        qemu = shutil.which(vm_boot.QEMU)
        kernel, init = vm_boot.find_kernel(), vm_boot.find_init()
        if qemu is None or kernel is None or init is None or accel == "none":
            missing = "qemu" if qemu is None else "a kernel under /boot" if kernel is None else ""
            raise VmError(f"the vm driver needs {missing or 'souk-init'}: see scripts/setup.sh")
        self.qemu = qemu
        self.images = images
        self.cgroups = cgroups
        initramfs = vm_boot.build_initramfs(kernel, init, vm_rootfs.disks_dir(images))
        self.guest = Guest(kernel, initramfs, accel)
        self._exits = ExitCodes()
        self._files = FileWatch()
        self._channels: dict[str, Channel] = {}
        self._recorders: dict[str, asyncio.Future[None]] = {}
        self._connecting: dict[str, asyncio.Lock] = {}

    # -- preparing -------------------------------------------------------------------------

    async def prepare(self, launch: Launch) -> str | None:
        if not launch.config.image:
            raise VmError("the vm driver runs images; this machine names none")
        digest = launch.image_digest or _prepared(launch)
        image = await self.images.pull(launch.config.image, digest)
        if digest != image.digest:
            self.images.store.pin(image.digest, _pin(launch))
        made, net = await asyncio.gather(
            self._disk(image, launch), network.setup(launch.machine_id, launch.private_ip),
            return_exceptions=True,
        )  # fmt: skip
        for result in (made, net):
            if isinstance(result, BaseException):
                raise result
        await _tap(launch.machine_id)
        # the volumes an earlier guest held stay recorded until they are given back
        state = {**_state(launch.rundir), "marker": launch.marker, "image": image.digest}
        (launch.rundir / STATE).write_text(json.dumps(state))
        return image.digest

    async def _disk(self, image: Image, launch: Launch) -> None:
        base = await vm_rootfs.base_image(self.images, image)
        owner = (launch.user.uid, launch.user.gid) if launch.user else None
        await vm_rootfs.overlay(base, launch.rundir / "root.qcow2", owner)

    # -- spawning --------------------------------------------------------------------------

    async def spawn(self, launch: Launch) -> Handle:
        rundir = launch.rundir
        if launch.resumed and (found := _running(rundir, launch.marker)) is not None:
            adopted = self.adopt(launch.machine_id, launch.marker, found)
            if adopted is not None:
                return adopted
        state = _state(rundir)
        if state.get("marker") != launch.marker:
            await self.prepare(launch)
            state = _state(rundir)
        image = await self.images.pull(launch.config.image or "", state["image"])
        ipv4: str | None = launch.private_ip
        if ":" in launch.private_ip:  # on the private network: the namespace's IPv4 beside it
            ipv4 = await asyncio.to_thread(network.egress, launch.machine_id)
        if ipv4 is None:
            raise VmError("the machine's network namespace has no IPv4 address")
        try:
            config = vm_guest.config_frame(self.images, launch, image, ipv4)
        except vm_guest.NoCommand as exc:
            raise VmError(str(exc)) from exc
        for name in ("qemu.pid", "exit_code", "guest_exit", "ctl.sock", "qmp.sock"):
            (rundir / name).unlink(missing_ok=True)
        await _lend_volumes(launch)
        guest = launch.config.guest
        procs = self.cgroups.prepare(launch.machine_id, guest.cpus, guest.memory_mb + OVERHEAD_MB)
        netns = network.NETNS_DIR / network.names(launch.machine_id)[0]
        qemu = ["nsenter", f"--net={netns}", "--", *self._argv(launch)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SOUK_MARKER": launch.marker}
        with (
            logs.output_files(rundir) as (out, err),
            launcher.launching(_shim(qemu, _launcher_prefix()), None, procs, env) as start,
        ):
            shim = start.detached(out, err, rundir)  # its exit read on a pidfd
        exited = asyncio.ensure_future(child_exit(shim.pid, shim.wait))
        try:
            handle = await self._boot(launch, config, exited)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                if (pid := _pid(rundir)) is not None:
                    os.kill(pid, signals.SIGKILL)
            await asyncio.wait([exited])
            await self._drop_channel(launch.machine_id)
            await _give_back_volumes(rundir)
            raise
        self._exits.expect(launch.machine_id, self._exit_code(exited, rundir))
        return handle

    async def _boot(
        self, launch: Launch, config: list[bytes], exited: asyncio.Future[int]
    ) -> Handle:
        """qemu's pid once it runs, then the guest's `started` once its processes run."""
        rundir = launch.rundir
        if not await self._files.appears(rundir / "qemu.pid", exited):
            raise VmError(f"qemu did not start: see {rundir.name}/stderr.log")
        for _ in range(500):  # the file is made before its pid is written in it
            if (pid := _pid(rundir)) is not None:
                break
            await asyncio.sleep(0.01)
        else:
            raise VmError("qemu wrote no pid")
        handle = Handle(pid, procfs.start_time(pid) or "0")
        channel = await self._connect(launch.machine_id, rundir)
        deadline = asyncio.get_running_loop().time() + BOOT_SECONDS
        # The config once the guest init says hello: sent before its port is open, it could
        # wait unread in qemu.
        await _first(channel.hello, exited, deadline, rundir)
        await channel.send(b"C", config)
        failed = await _first(channel.ready, exited, deadline, rundir)
        if failed is not None:
            raise VmError(f"the guest did not start: {failed}")
        return handle

    def _argv(self, launch: Launch) -> list[str]:
        """qemu's command line: devices by machine type, the app's user, the sandbox."""
        guest, micro = launch.config.guest, self.guest.accel == "kvm"
        bus = "device" if micro else "pci"
        argv = [self.qemu, "-name", f"souk-{launch.machine_id}", "-nodefaults", "-no-user-config"]
        argv += ["-display", "none", "-no-reboot", "-m", str(guest.memory_mb)]
        argv += ["-smp", str(guest.cpus), "-pidfile", "qemu.pid"]
        # the guest's RAM a memfd, which a suspend saves to disk and frees (`vm_memory`)
        argv += ["-object", f"memory-backend-memfd,id=ram,size={guest.memory_mb}M"]
        if micro:
            argv += ["-accel", "kvm", "-cpu", "host"]
            argv += ["-M", "microvm,x-option-roms=off,rtc=off,memory-backend=ram"]
        else:
            argv += ["-accel", f"tcg,tb-size={TCG_CACHE_MB}", "-M", "q35,memory-backend=ram"]
        argv += ["-kernel", str(self.guest.kernel.image), "-initrd", str(self.guest.initramfs)]
        argv += ["-append", "console=ttyS0 panic=-1 quiet loglevel=3"]
        argv += ["-serial", "file:console.log", "-device", DEBUG_EXIT]
        argv += ["-qmp", "unix:qmp.sock,server=on,wait=off"]
        argv += ["-drive", "if=none,id=root,file=root.qcow2,format=qcow2,discard=unmap"]
        argv += ["-device", f"virtio-blk-{bus},drive=root"]
        for i, (_, mountpoint) in enumerate(launch.volumes):
            disk = vm_volumes.disk_of(mountpoint)
            argv += ["-drive", f"if=none,id={vm_guest.serial(i)},file={disk},format=raw,cache=none"]
            argv += [
                "-device",
                f"virtio-blk-{bus},drive={vm_guest.serial(i)},serial={vm_guest.serial(i)}",
            ]
        mac = _mac(launch.machine_id)
        argv += ["-netdev", "tap,id=net,ifname=tap0,script=no,downscript=no"]
        argv += ["-device", f"virtio-net-{bus},netdev=net,mac={mac}"]
        argv += ["-device", f"virtio-serial-{bus}"]
        for stream in logs.STREAMS:
            argv += ["-chardev", f"file,id={stream},path={stream}.log,append=on"]
            argv += ["-device", f"virtconsole,chardev={stream}"]
        argv += ["-chardev", "socket,id=ctl,path=ctl.sock,server=on,wait=off"]
        argv += ["-device", "virtserialport,chardev=ctl,name=souk.0"]
        if launch.user is not None and os.geteuid() == 0:
            argv += ["-runas", f"{launch.user.uid}:{launch.user.gid}"]
        return [*argv, "-sandbox", SANDBOX]

    # -- the channel -----------------------------------------------------------------------

    async def _connect(self, machine_id: str, rundir: Path) -> Channel:
        """The guest's channel, connected once: qemu serves one client at a time, and a second
        connection would wait unserved while it is kept as the one to use."""
        async with self._connecting.setdefault(machine_id, asyncio.Lock()):
            channel = self._channels.get(machine_id)
            if channel is not None and not channel.closed:
                return channel
            channel = await Channel.connect_in(rundir, "ctl.sock")
            self._channels[machine_id] = channel
            self._recorders[machine_id] = asyncio.ensure_future(_record_exit(channel, rundir))
            return channel

    async def _drop_channel(self, machine_id: str) -> None:
        channel = self._channels.pop(machine_id, None)
        self._recorders.pop(machine_id, None)
        self._connecting.pop(machine_id, None)
        if channel is not None:
            await channel.close()

    async def _exit_code(self, exited: asyncio.Future[int], rundir: Path) -> int | None:
        await exited
        await _give_back_volumes(rundir)
        return await _read_exit(rundir)

    # -- the rest of the protocol ----------------------------------------------------------

    def adopt(self, machine_id: str, marker: str, handle: Handle | None) -> Handle | None:
        if handle is not None and self._exits.watching(machine_id):
            return handle
        if handle is None or not procfs.is_alive(handle.pid, handle.pid_start):
            return None
        if not procfs.has_marker(handle.pid, marker):
            return None
        try:
            rundir = Path(os.readlink(f"/proc/{handle.pid}/cwd"))
        except OSError:
            return None
        self._exits.expect(machine_id, self._watch(machine_id, handle, rundir))
        return handle

    async def _watch(self, machine_id: str, handle: Handle, rundir: Path) -> int | None:
        """A guest a worker before this one started: its channel again, then its end."""
        with contextlib.suppress(ChannelClosed, OSError):
            await self._connect(machine_id, rundir)
        await until_gone(handle, POLL)
        await _give_back_volumes(rundir)
        return await _read_exit(rundir)

    async def wait(self, machine_id: str) -> int | None:
        return await self._exits.wait(machine_id)

    async def stop(
        self, machine_id: str, handle: Handle | None, signal: str, timeout: float
    ) -> None:
        if handle is None or not procfs.is_alive(handle.pid, handle.pid_start):
            return
        if signal == "SIGKILL":
            # The guest's init kills its processes at once, then syncs and powers off: what
            # they wrote reaches the disks (a volume's included), as a killed container's does.
            # qemu itself is killed only if the guest does not end within the grace.
            timeout = max(timeout, KILL_GRACE)
        await self.thaw(machine_id, handle)
        rundir = _rundir(handle)
        with contextlib.suppress(ChannelClosed, OSError):  # 'T': a stop, nothing restarted
            if rundir is not None:
                channel = await self._connect(machine_id, rundir)
                await channel.send(b"T", [str(signals.Signals[signal].value).encode()])
        try:
            await asyncio.wait_for(self._gone(machine_id, handle), timeout)
            return
        except TimeoutError:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.kill(handle.pid, signals.SIGKILL)
        await self._gone(machine_id, handle)

    async def _gone(self, machine_id: str, handle: Handle) -> None:
        await self._exits.wait(machine_id)
        await poll_until_gone(handle, POLL)

    async def remaining(self, machine_id: str, handle: Handle | None) -> list[int]:
        """qemu: everything of the guest is inside it."""
        if handle is None or not procfs.is_alive(handle.pid, handle.pid_start):
            return []
        return [handle.pid]

    async def freeze(self, machine_id: str, handle: Handle | None) -> None:
        """Pause the guest, save its memory to disk (`memory.snap`) and free it (`vm_memory`);
        idempotent."""
        rundir = _rundir(handle)
        if rundir is None or handle is None:
            return
        await vm_qmp.pause(rundir / "qmp.sock")
        await asyncio.to_thread(vm_memory.save, handle.pid, rundir / SNAPSHOT)

    async def thaw(self, machine_id: str, handle: Handle | None) -> None:
        """The saved memory back in the guest, then the guest on; a no-op for one that runs."""
        rundir = _rundir(handle)
        if rundir is None or handle is None:
            return
        snapshot = rundir / SNAPSHOT
        if snapshot.exists():
            await self._restore(machine_id, handle.pid, snapshot)
            snapshot.unlink()  # before the guest runs: never a snapshot beside a running guest
        if await vm_qmp.status(rundir / "qmp.sock") in ("paused", "postmigrate"):
            await vm_qmp.cont(rundir / "qmp.sock")

    async def _restore(self, machine_id: str, pid: int, snapshot: Path) -> None:
        """The snapshot's pages written back into qemu's RAM by a process in the machine's
        cgroups, which are charged for them as they were for the guest's own."""
        argv = vm_memory.restore_argv(pid, snapshot)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        procs = self.cgroups.procs_files(machine_id)
        with launcher.launching(argv, None, procs, env) as start:
            proc = await asyncio.create_subprocess_exec(
                *start.argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                **start.popen,
            )  # fmt: skip
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise VmError(f"the guest's memory was not restored: {err.decode().strip()}")

    async def signal(self, machine_id: str, handle: Handle | None, signal: str) -> None:
        rundir = _rundir(handle)
        if rundir is None:
            return
        channel = await self._connect(machine_id, rundir)
        await channel.send(b"S", [str(signals.Signals[signal].value).encode()])

    async def exec(
        self, launch: Launch, handle: Handle | None, argv: list[str], stdin: bytes, timeout: float
    ) -> ExecResult:
        """In the guest, by its init: the machine's environment, the image's user and working
        directory."""
        rundir = _rundir(handle)
        if rundir is None:
            raise VmError("the machine is not running")
        channel = await self._connect(launch.machine_id, rundir)
        image = await self.images.pull(launch.config.image or "", _state(rundir).get("image"))
        _, etc = vm_rootfs.base_paths(self.images, image.digest)
        uid, gid = resolve_user(image.config.user, etc)
        cwd = image.config.workdir or "/"
        fields = [str(uid).encode(), str(gid).encode(), cwd.encode(), stdin]
        fields += [a.encode() for a in argv]
        request, answer = await channel.ask(b"E", fields)
        try:
            found = await asyncio.wait_for(asyncio.shield(answer), timeout)
        except TimeoutError:
            await channel.send(b"K", [str(signals.SIGKILL.value).encode()], request)
            raise ExecTimeout() from None
        if len(found) < 4:
            return ExecResult(b"", b"the guest runs too many commands at once\n", 126)
        sig = int(found[1]) or None
        return ExecResult(found[2], found[3], int(found[0]), sig)

    async def processes(self, machine_id: str, handle: Handle | None) -> list[int]:
        return await self.remaining(machine_id, handle)

    async def guest_processes(self, machine_id: str, handle: Handle | None) -> list[str]:
        """`ps` inside the guest: "pid name" of each of its processes."""
        rundir = _rundir(handle)
        if rundir is None:
            return []
        channel = await self._connect(machine_id, rundir)
        _, answer = await channel.ask(b"P", [])
        return [f.decode(errors="replace") for f in await asyncio.wait_for(answer, 10)]

    async def cleanup(self, launch: Launch) -> None:
        self._exits.pop(launch.machine_id)
        await self._drop_channel(launch.machine_id)
        if (found := _running(launch.rundir, launch.marker)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(found.pid, signals.SIGKILL)
            await poll_until_gone(found, POLL)  # before its volumes are the host's again
        await network.teardown(launch.machine_id)
        self.cgroups.remove(launch.machine_id)
        await _give_back_volumes(launch.rundir)
        for name in ("root.qcow2", "root.qcow2.base", SNAPSHOT, f"{SNAPSHOT}.tmp", STATE):
            (launch.rundir / name).unlink(missing_ok=True)
        self.images.store.unpin(_pin(launch))
        await asyncio.to_thread(vm_rootfs.collect, self.images)
        if launch.home is not None:
            await asyncio.to_thread(shutil.rmtree, launch.home, True)

    async def close(self) -> None:
        self._files.close()
        for machine_id in list(self._channels):
            await self._drop_channel(machine_id)


# -- helpers ---------------------------------------------------------------------------------


def _pin(launch: Launch) -> str:
    return str(launch.rundir / "root.qcow2")


def _state(rundir: Path) -> dict[str, Any]:
    try:
        found = json.loads((rundir / STATE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _prepared(launch: Launch) -> str | None:
    """The image this very start prepared, if it did (a start resumed after a crash)."""
    state = _state(launch.rundir)
    if launch.resumed and state.get("marker") == launch.marker:
        image = state.get("image")
        return image if isinstance(image, str) else None
    return None


def _pid(rundir: Path) -> int | None:
    try:
        return int((rundir / "qemu.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _running(rundir: Path, marker: str) -> Handle | None:
    pid = _pid(rundir)
    if pid is None or not procfs.has_marker(pid, marker):
        return None
    start = procfs.start_time(pid)
    return Handle(pid, start) if start else None


def _rundir(handle: Handle | None) -> Path | None:
    """A running guest's directory: qemu's working directory."""
    if handle is None or not procfs.is_alive(handle.pid, handle.pid_start):
        return None
    try:
        return Path(os.readlink(f"/proc/{handle.pid}/cwd"))
    except OSError:
        return None


def _mac(machine_id: str) -> str:
    """A locally administered address of the machine's own."""
    digits = hashlib.sha256(machine_id.encode()).digest()[:4]
    return "52:54:" + ":".join(f"{b:02x}" for b in digits)


async def _first(
    wanted: asyncio.Future[Any], exited: asyncio.Future[int], deadline: float, rundir: Path
) -> Any:
    """`wanted`'s result, unless qemu exits first or the deadline passes."""
    waiting = asyncio.ensure_future(asyncio.shield(wanted))
    racing: list[asyncio.Future[Any]] = [waiting, exited]
    timeout = max(0.0, deadline - asyncio.get_running_loop().time())
    done, _ = await asyncio.wait(racing, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:
        waiting.cancel()
        why = "qemu exited" if exited.done() else f"not started in {BOOT_SECONDS:.0f}s"
        raise VmError(f"the guest did not start ({why}): see {rundir.name}/console.log")
    return waiting.result()


async def _record_exit(channel: Channel, rundir: Path) -> None:
    """The guest's own report of its exit code, kept beside qemu's (which holds 7 bits)."""
    with contextlib.suppress(ChannelClosed, asyncio.CancelledError):
        code = await asyncio.shield(channel.exit_code)
        (rundir / "guest_exit").write_text(str(code))


async def _read_exit(rundir: Path) -> int | None:
    """The guest's report, else what qemu's exit says: an isa-debug-exit code n is (n << 1) | 1,
    a qemu killed by a signal 128 + its number (the shim's), 0 a power-off with no report."""
    for _ in range(20):  # the report may be a moment behind qemu's exit
        with contextlib.suppress(OSError, ValueError):
            return int((rundir / "guest_exit").read_text())
        await asyncio.sleep(POLL)
    with contextlib.suppress(OSError, ValueError):
        code = int((rundir / "exit_code").read_text())
        if code >= 128:
            return code
        return (code - 1) // 2 if code & 1 else None
    return None


async def _tap(machine_id: str) -> None:
    """tap0 in the machine's namespace, and a tc redirect each way between it and eth0."""
    netns = network.names(machine_id)[0]
    steps = [
        ["ip", "-n", netns, "tuntap", "add", "dev", "tap0", "mode", "tap"],
        ["ip", "-n", netns, "link", "set", "tap0", "up"],
    ]
    for one, other in (("eth0", "tap0"), ("tap0", "eth0")):
        steps.append(["tc", "-n", netns, "qdisc", "replace", "dev", one, "ingress"])
        steps.append(
            [
                *("tc", "-n", netns, "filter", "replace", "dev", one, "parent", "ffff:"),
                *("pref", "1", "protocol", "all", "u32", "match", "u32", "0", "0"),
                *("action", "mirred", "egress", "redirect", "dev", other),
            ]
        )
    for step in steps:
        proc = await asyncio.create_subprocess_exec(
            *step, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        _, err = await proc.communicate()
        if proc.returncode != 0 and b"exists" not in err and b"busy" not in err:
            raise VmError(f"{' '.join(step[3:])}: {err.decode().strip()}")


async def _lend_volumes(launch: Launch) -> None:
    """The launch's volumes lent to its guest (`vm_volumes`), recorded beside qemu's files first
    so that whoever sees qemu gone gives them back, this worker or the next; a volume an earlier
    spawn held and this one does not is given back."""
    state = _state(launch.rundir)
    roots = [str(vm_volumes.paths(mountpoint).root) for _, mountpoint in launch.volumes]
    for root in state.get("volumes", []):
        if root not in roots:
            await asyncio.to_thread(vm_volumes.give_back, volume_disk.VolumePaths(Path(root)))
    state["volumes"] = roots
    (launch.rundir / STATE).write_text(json.dumps(state))
    for root in roots:
        await asyncio.to_thread(vm_volumes.lend, volume_disk.VolumePaths(Path(root)))


async def _give_back_volumes(rundir: Path) -> None:
    """The volumes of the guest that ran in `rundir` mounted on the host again (qemu is gone)."""
    for root in _state(rundir).get("volumes", []):
        try:
            await asyncio.to_thread(vm_volumes.give_back, volume_disk.VolumePaths(Path(root)))
        except (OSError, volume_disk.DiskError) as exc:
            log.error("volume %s could not be mounted again: %s", Path(root).name, exc)


def _launcher_prefix() -> list[str]:
    """What the exit-code shim runs after: souk-launch itself (qemu joins the machine's network
    namespace by `nsenter`, not by the launcher's `--netns` as runc does)."""
    return [launcher.LAUNCHER] if launcher.LAUNCHER is not None else []

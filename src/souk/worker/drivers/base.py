"""What the worker asks of a driver. Every call must be idempotent: after a crash the engine
repeats the step it was in, so a driver asked to spawn a machine that already runs must find it,
not start a second copy."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from souk.models.machine import MachineConfig
from souk.worker.host.identity import HostUser

if TYPE_CHECKING:
    from souk.worker.oci.images import ImageCache

DriverKind = Literal["command", "image"]


@dataclass(frozen=True)
class Handle:
    """How the worker finds a machine's process again: its pid and that pid's start time."""

    pid: int
    pid_start: str


@dataclass(frozen=True)
class Launch:
    machine_id: str
    app: str
    region: str
    instance_id: str
    config: MachineConfig
    marker: str  # unique per spawn; lets the driver find the process after a worker crash
    rundir: Path  # the machine's own directory: logs, root filesystem, scratch
    private_ip: str
    # Whether an earlier worker run may have spawned this marker already: only then must a
    # driver look for that copy (for the process driver, a scan of every process on the host).
    resumed: bool = True
    # The app's own directory for this machine (a host command's home, a container's root
    # filesystem), and the identity that owns it; None: the machine runs as the worker does.
    home: Path | None = None
    user: HostUser | None = None
    # The app's secrets as the machine got them (in `config.env` already): for `config.files`.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    def identity_env(self) -> dict[str, str]:
        """What every machine is told of itself in its environment, whatever runs it."""
        return {
            "SOUK_MACHINE_ID": self.machine_id,
            "SOUK_APP_NAME": self.app,
            "SOUK_REGION": self.region,
            "SOUK_INSTANCE_ID": self.instance_id,
            "SOUK_PRIVATE_IP": self.private_ip,
        }

    def file_owner(self) -> tuple[int, int] | None:
        """Who owns the files written into the machine: the app's host user (a container's
        root) on a root worker; None (the worker's own user) otherwise."""
        if self.user is None or os.geteuid() != 0:
            return None
        return (self.user.uid, self.user.gid)

    # (path in the machine, mounted volume's directory on the host), from config.mounts
    volumes: tuple[tuple[str, Path], ...] = ()
    # The image this version of the machine first started with (its digest), run again however
    # its tag has moved since; None: the version's first start, which looks the tag up.
    image_digest: str | None = None


@dataclass(frozen=True)
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit_code: int
    signal: int | None = None  # the signal that ended it, if one did


class ExecTimeout(Exception):
    """The command ran past its timeout; it was killed."""


class Driver(Protocol):
    name: str

    async def prepare(self, launch: Launch) -> str | None:
        """Get ready to spawn (pull an image, unpack a root filesystem); may take a while.
        Returns the digest of the image prepared (None: the driver runs no image), which the
        later starts of this version of the machine get as `Launch.image_digest`."""

    async def spawn(self, launch: Launch) -> Handle:
        """Start the machine, or return the handle of the copy already running for this marker.
        Returns once what runs is the machine's own command, as its app, within its limits."""

    def adopt(self, machine_id: str, marker: str, handle: Handle | None) -> Handle | None:
        """The running process of this spawn, if it is still alive (after a worker restart)."""

    async def wait(self, machine_id: str) -> int | None:
        """Its exit code once it exits; None when the code is unknown (an adopted process)."""

    async def stop(
        self, machine_id: str, handle: Handle | None, signal: str, timeout: float
    ) -> None:
        """Send `signal`, then SIGKILL after `timeout` seconds; returns once it has exited, and
        nothing it started runs on."""

    async def remaining(self, machine_id: str, handle: Handle | None) -> list[int]:
        """Host pids of the machine's processes still running (none once it is stopped): what
        a destroy checks before it releases the machine's reservation."""

    async def cleanup(self, launch: Launch) -> None:
        """Release what the machine held on the host (network, mounts, cgroups)."""

    async def freeze(self, machine_id: str, handle: Handle | None) -> None:
        """Freeze every process of the machine where it is (suspend); idempotent."""

    async def thaw(self, machine_id: str, handle: Handle | None) -> None:
        """Let a frozen machine run on (resume); a no-op for one that is not frozen."""

    async def signal(self, machine_id: str, handle: Handle | None, signal: str) -> None:
        """Send `signal` to the machine's main process, and nothing more."""

    async def exec(
        self, launch: Launch, handle: Handle | None, argv: list[str], stdin: bytes, timeout: float
    ) -> ExecResult:
        """Run `argv` inside the machine (its environment, user, cgroup, namespaces) and
        collect its output; `ExecTimeout` once `timeout` seconds pass (it is killed then)."""

    async def processes(self, machine_id: str, handle: Handle | None) -> list[int]:
        """Host pids of the machine's processes, for `ps`."""

    async def close(self) -> None:
        """The worker stops: what the driver keeps for starting machines ends (not the
        machines)."""


@dataclass
class Drivers:
    """What a worker runs machines with: host commands always, images where the host can
    (root and runc), and the image cache those share."""

    command: Driver
    image: Driver | None = None
    images: ImageCache | None = None
    vm: str | None = None  # what runs guests (kvm, tcg, none) for the vm driver; None: no vms

    @staticmethod
    def kind_of(config: MachineConfig) -> DriverKind:
        return "image" if config.image else "command"

    def get(self, kind: DriverKind) -> Driver | None:
        return self.command if kind == "command" else self.image

    def require(self, kind: str | None) -> Driver:
        """The driver a machine's row names; a machine that never ran a process names none, and
        the command driver then finds nothing of it to stop or clean up."""
        driver = self.command if kind in (None, "command") else self.image
        if driver is None:
            raise RuntimeError(f"this worker has no {kind} driver")
        return driver

    def image_cached(self, image: str | None) -> bool:
        return bool(image) and self.images is not None and self.images.has(image or "")

    async def close(self) -> None:
        await self.command.close()
        if self.image is not None:
            await self.image.close()
        if self.images is not None:
            await self.images.client.close()

"""The OCI runtime spec (`config.json`) runc runs a machine from: the image config's process,
overridden by the machine config, its guest limits as cgroup limits, and its own namespaces.

What a container may do is cut down as runc's own `runc spec` does (its short capability list,
no new privileges, masked and read-only kernel files), plus a seccomp filter that refuses the
system calls a service never needs and the kernel's riskiest surfaces (docs/oci.md says which and
why); given the app's host ids, its root is root only inside a user namespace of its own.
"""

from __future__ import annotations

import errno
import platform
from pathlib import Path
from typing import Any

from souk.models.machine import MachineConfig
from souk.worker.host.identity import HostUser
from souk.worker.oci import inroot
from souk.worker.oci.config import ImageConfig

CPU_PERIOD = 100_000
CAPABILITIES = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
MASKED_PATHS = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
    "/sys/devices/virtual/tpm",
]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
DENIED_SYSCALLS = [
    # the kernel keyring is not namespaced: keys of the host and of other containers
    "add_key",
    "keyctl",
    "request_key",
    # the filesystem view: a container gets the mounts runc made, and no others
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # the kernel itself: what runs in it, and whether it runs at all
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    # large attack surfaces a service does not need
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "open_by_handle_at",  # opens any file of a filesystem by its handle, past the mounts
    # joining namespaces (and, below, making user namespaces)
    "setns",
]
CLONE_NEWUSER = 0x10000000
ARCHITECTURES = {
    "x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
}


def seccomp_profile() -> dict[str, Any]:
    """Allow by default, refuse the calls above with EPERM. A user namespace would give its
    maker every capability inside it, and with them kernel code meant for root: `unshare` and
    `clone` may not make one, and `clone3` (whose flags a filter cannot read) says it does not
    exist, so that libc falls back to `clone`."""
    new_user_ns = {
        "index": 0,
        "value": CLONE_NEWUSER,
        "valueTwo": CLONE_NEWUSER,
        "op": "SCMP_CMP_MASKED_EQ",
    }
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ARCHITECTURES.get(platform.machine(), []),
        "syscalls": [
            {"names": DENIED_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
            {
                "names": ["unshare", "clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": errno.EPERM,
                "args": [new_user_ns],
            },
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
        ],
    }


def resolve_user(user: str, rootfs: Path) -> tuple[int, int]:
    """`uid[:gid]` or names looked up in the image's own /etc/passwd and /etc/group, read
    inside the root filesystem (`inroot`: a link in the image resolves as in the container)."""
    name, _, group = user.partition(":")
    uid, gid = 0, 0
    if name:
        uid, gid = _lookup(rootfs, "/etc/passwd", name, with_gid=True)
    if group:
        gid = _lookup(rootfs, "/etc/group", group, with_gid=False)[0]
    return uid, gid


def _lookup(rootfs: Path, table: str, name: str, with_gid: bool) -> tuple[int, int]:
    if name.isdigit():
        return int(name), int(name) if not with_gid else 0
    try:
        lines = inroot.read(rootfs, table).decode(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split(":")
        if len(fields) > 3 and fields[0] == name and fields[2].isdigit():
            gid = fields[3] if with_gid else "0"
            return int(fields[2]), int(gid) if gid.isdigit() else 0
    raise ValueError(f"user or group {name!r} is not in the image's {table}")


def runtime_spec(
    image: ImageConfig,
    config: MachineConfig,
    rootfs: Path,
    hostname: str,
    extra_env: dict[str, str],
    netns: Path | None,
    cgroup: str,
    annotations: dict[str, str],
    user: HostUser | None = None,
    volumes: tuple[tuple[str, Path], ...] = (),
) -> dict[str, Any]:
    """With `user`, the container runs in a user namespace mapping its ids 0.. to the user's
    range: its root is root inside, and an unprivileged id of the app's on the host. With
    `netns`, runc must run inside that network namespace: the spec does not name it."""
    argv = image.argv(config.init)
    if not argv:
        raise ValueError("the image names no command and the machine config gives none")
    uid, gid = resolve_user(image.user, rootfs)
    caps = {k: CAPABILITIES for k in ("bounding", "effective", "permitted")}
    namespaces: list[dict[str, str]] = [
        {"type": t} for t in ("pid", "mount", "ipc", "uts", "cgroup")
    ]
    if netns is None:
        namespaces.append({"type": "network"})
    # else none: runc is started inside `netns` (`souk-launch --netns`), and the container keeps
    # it. Named here, it would be joined by `runc exec` after the container's user namespace,
    # which has no rights over a namespace the worker made (runc before 1.2: setns EPERM).
    guest = config.guest
    memory = guest.memory_mb << 20
    sysfs: dict[str, Any] = {
        "destination": "/sys",
        "type": "sysfs",
        "source": "sysfs",
        "options": ["nosuid", "noexec", "nodev", "ro"],
    }
    ids: dict[str, Any] = {}
    if user is not None:
        namespaces.append({"type": "user"})
        ids = {
            "uidMappings": [{"containerID": 0, "hostID": user.uid, "size": user.span}],
            "gidMappings": [{"containerID": 0, "hostID": user.gid, "size": user.span}],
        }
        if netns is not None:
            # sysfs may only be mounted by the user namespace that owns the network namespace,
            # and the worker made that one: the host's, read-only, as rootless runc does.
            sysfs = {
                "destination": "/sys",
                "type": "none",
                "source": "/sys",
                "options": ["rbind", "nosuid", "noexec", "nodev", "ro"],
            }
    return {
        "ociVersion": "1.0.2",
        "hostname": hostname,
        "annotations": annotations,
        "root": {"path": str(rootfs), "readonly": False},
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": argv,
            "env": image.environment({**config.env, **extra_env}),
            "cwd": image.workdir or "/",
            "capabilities": caps,
            "noNewPrivileges": True,
        },
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
            },
            {
                "destination": "/dev/shm",
                "type": "tmpfs",
                "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
            },
            {
                "destination": "/dev/mqueue",
                "type": "mqueue",
                "source": "mqueue",
                "options": ["nosuid", "noexec", "nodev"],
            },
            sysfs,
            *(
                {
                    "destination": path,
                    "type": "none",
                    "source": str(directory),
                    "options": ["rbind", "rw", "nosuid", "nodev"],
                }
                for path, directory in volumes
            ),
        ],
        "linux": {
            "namespaces": namespaces,
            **ids,
            "cgroupsPath": cgroup,
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": {"limit": memory, "swap": memory},
                "cpu": {"quota": guest.cpus * CPU_PERIOD, "period": CPU_PERIOD},
                "pids": {"limit": 4096},
            },
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
            "seccomp": seccomp_profile(),
        },
    }

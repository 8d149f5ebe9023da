"""The OCI runtime spec (`config.json`) runc runs a machine from: the image config's process,
overridden by the machine config, its guest limits as cgroup limits, and its own namespaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from souk.models.machine import MachineConfig
from souk.worker.oci.config import ImageConfig

CPU_PERIOD = 100_000
CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SYS_CHROOT",
    "CAP_MKNOD",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
]


def resolve_user(user: str, rootfs: Path) -> tuple[int, int]:
    """`uid[:gid]` or names looked up in the image's own /etc/passwd and /etc/group."""
    name, _, group = user.partition(":")
    uid, gid = 0, 0
    if name:
        uid, gid = _lookup(rootfs / "etc" / "passwd", name, with_gid=True)
    if group:
        gid = _lookup(rootfs / "etc" / "group", group, with_gid=False)[0]
    return uid, gid


def _lookup(table: Path, name: str, with_gid: bool) -> tuple[int, int]:
    if name.isdigit():
        return int(name), int(name) if not with_gid else 0
    try:
        lines = table.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split(":")
        if len(fields) > 3 and fields[0] == name:
            return int(fields[2]), int(fields[3]) if with_gid else 0
    raise ValueError(f"user or group {name!r} is not in the image's {table.name}")


def runtime_spec(
    image: ImageConfig,
    config: MachineConfig,
    rootfs: Path,
    hostname: str,
    extra_env: dict[str, str],
    netns: Path | None,
    cgroup: str,
    annotations: dict[str, str],
) -> dict[str, Any]:
    argv = image.argv(config.init)
    if not argv:
        raise ValueError("the image names no command and the machine config gives none")
    uid, gid = resolve_user(image.user, rootfs)
    caps = {k: CAPABILITIES for k in ("bounding", "effective", "permitted")}
    namespaces: list[dict[str, str]] = [
        {"type": t} for t in ("pid", "mount", "ipc", "uts", "cgroup")
    ]
    namespaces.append({"type": "network", "path": str(netns)} if netns else {"type": "network"})
    guest = config.guest
    memory = guest.memory_mb << 20
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
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            },
        ],
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": cgroup,
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": {"limit": memory, "swap": memory},
                "cpu": {"quota": guest.cpus * CPU_PERIOD, "period": CPU_PERIOD},
                "pids": {"limit": 4096},
            },
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"],
        },
    }

"""What souk-init is told of its guest, on its channel at boot: the hostname, the addresses
and routes, the root and volume disks, resolv.conf, env, `files` and each process with its ids
and restart policy. A frame of key, value pairs, never the kernel command line (readable inside
the guest)."""

from __future__ import annotations

from souk.models.machine import MachineProcess
from souk.worker.drivers import vm_rootfs
from souk.worker.drivers.base import Launch
from souk.worker.drivers.process import process_env
from souk.worker.drivers.runc import restart_of
from souk.worker.oci import network
from souk.worker.oci.images import Image, ImageCache
from souk.worker.oci.spec import resolve_user


class NoCommand(ValueError):
    """Neither the image nor the machine's config names a command to run."""


def config_frame(images: ImageCache, launch: Launch, image: Image, ipv4: str) -> list[bytes]:
    """What the guest init reads on its channel: key, value, key, value..."""
    _, etc = vm_rootfs.base_paths(images, image.digest)
    uid, gid = resolve_user(image.config.user, etc)
    env = machine_env(launch, image)
    pairs: list[tuple[str, str | bytes]] = [
        ("hostname", launch.machine_id),
        *network_config(launch.private_ip, ipv4),
        ("root", "/dev/vda"),
        *(("volume", f"{serial(i)} {path}") for i, (path, _) in enumerate(launch.volumes)),
        *resolver_file(launch.private_ip),
        *(("env", f"{k}={v}") for k, v in env.items()),
        ("exec_ids", f"{uid}:{gid}"),
        ("exec_cwd", image.config.workdir or "/"),
    ]
    for file in launch.config.files:
        content = file.content(launch.secrets)
        pairs += [("file_path", file.guest_path), ("file_mode", f"{file.file_mode():o}")]
        pairs += [("file_data", content)]
    processes: list[MachineProcess | None] = [*launch.config.processes] or [None]
    for process in processes:
        if process is None:
            argv, ids = image.config.argv(launch.config.init), f"{uid}:{gid}"
        else:
            argv = process.argv(launch.config.init) or image.config.argv(launch.config.init)
            offset = process.uid_offset()
            ids = f"{offset}:{offset}" if process.user else f"{uid}:{gid}"
        if not argv:
            raise NoCommand("the image names no command and the machine config gives none")
        pairs += [("proc", restart_of(process, launch.config)), ("ids", ids)]
        pairs += [("cwd", image.config.workdir or "/")]
        pairs += [("arg", a) for a in argv]
        pairs += [("penv", e) for e in process_lines(launch, env, process)]
    return [x if isinstance(x, bytes) else x.encode() for pair in pairs for x in pair]


def network_config(private_ip: str, ipv4: str) -> list[tuple[str, str | bytes]]:
    """The guest's addresses and routes, as a runc machine's namespace has them
    (`oci/network.py`): the machine's IPv4 address (/32) with the default route through the
    host's veth, and on the private network (docs/network.md) its private IPv6 address (/128)
    with the default route through the veth's `fe80::1`."""
    pairs: list[tuple[str, str | bytes]] = [("addr", ipv4), ("gw", network.GATEWAY)]
    if ":" in private_ip:  # else off the private network (a machine made before it)
        pairs += [("addr6", private_ip), ("gw6", network.GATEWAY6)]
    return pairs


def resolver_file(private_ip: str) -> list[tuple[str, str | bytes]]:
    """/etc/resolv.conf naming the worker's DNS, once the root disk is mounted and before the
    machine's own `files` (which may replace it)."""
    if ":" not in private_ip:
        return []
    resolv = f"nameserver {network.resolver(private_ip)}\n"
    return [("file_path", "/etc/resolv.conf"), ("file_mode", "644"), ("file_data", resolv)]


def serial(index: int) -> str:
    """The serial number of a volume's disk, by which the guest init finds it."""
    return f"vol{index}"


def machine_env(launch: Launch, image: Image) -> dict[str, str]:
    env = dict(e.partition("=")[::2] for e in image.config.environment(launch.config.env))
    env.update(launch.identity_env())
    return env


def process_lines(launch: Launch, env: dict[str, str], process: MachineProcess | None) -> list[str]:
    own = env if process is None else process_env(launch, process, env)
    return [f"{k}={v}" for k, v in own.items()]

"""Volumes lent to vm guests. A volume is an ext4 file the worker keeps mounted on the host
through a loop device (`volume_disk.py`); a guest mounts it as a virtio disk of its own, and a
file system mounted by two kernels at once is corrupted. So while a guest holds a volume's disk,
the host's mount is undone (and its loop device detached) and an empty placeholder, a tiny
tmpfs, is mounted in its place: the worker's volume machinery, which mounts every volume that is
not mounted (at its restart, before a start), finds it mounted and leaves it. Once qemu is gone
the placeholder goes and the volume is mounted on the host again. Both under the volume's lock
(`volume_disk.exclusive`), as every step on a volume is.

While lent, a volume cannot be snapshotted (the placeholder refuses to freeze) or grown online
(its file system is not mounted on the host and is not clean): both fail with the reason, and
work again once the machine is stopped."""

from __future__ import annotations

import subprocess
from pathlib import Path

from souk.worker.volumes import disk as volume_disk

PLACEHOLDER = "souk-vm-lent"  # the placeholder's source, as /proc/self/mountinfo shows it


def paths(mountpoint: Path) -> volume_disk.VolumePaths:
    """A volume's paths from its mount point, which is what a driver is given."""
    return volume_disk.VolumePaths(mountpoint.parent)


def disk_of(mountpoint: Path) -> Path:
    return paths(mountpoint).image


def _source(mountpoint: Path) -> str | None:
    """The source of the last mount at `mountpoint` (None: nothing is mounted there)."""
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and fields[4].replace("\\040", " ") == str(mountpoint):
                after = fields[fields.index("-") + 1 :]
                found = after[1] if len(after) > 1 else ""
    return found


def lent(p: volume_disk.VolumePaths) -> bool:
    return _source(p.mountpoint) == PLACEHOLDER


def lend(p: volume_disk.VolumePaths) -> None:
    """The volume's disk free for a guest: unmounted and detached on the host, the placeholder
    in its place; lent already is fine."""
    with volume_disk.exclusive(p):
        if lent(p):
            return
        volume_disk.unmount(p)
        volume_disk.detach(p)
        p.mountpoint.mkdir(mode=0o700, exist_ok=True)
        options = "size=4k,nr_inodes=4,mode=0700,nodev,nosuid,noexec"
        _run("mount", "-t", "tmpfs", "-o", options, PLACEHOLDER, str(p.mountpoint))


def give_back(p: volume_disk.VolumePaths) -> None:
    """The volume mounted on the host again (its guest is gone); not lent is fine."""
    with volume_disk.exclusive(p):
        while lent(p):
            _run("umount", str(p.mountpoint))
        if p.image.exists():
            volume_disk.mount(p)


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise volume_disk.DiskError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")

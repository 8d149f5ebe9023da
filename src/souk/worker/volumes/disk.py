"""A volume's real storage: a sparse file formatted ext4, attached to a loop device and mounted
under the worker's data directory, so its size is the file system's, not a promise.

Every function here is idempotent and finds what an earlier, interrupted call left (a loop device
is found by its backing file, a mount by its mount point), so a step that ran half-way before a
`kill -9` runs again without leaking a device, a mount or a file. Half-made files carry a `.tmp`
suffix until they are complete and are renamed into place; a rename is the moment they exist.

A `kill -9` does not stop the tool the worker was running (an e2fsck, a resize2fs, a copy): it
goes on, orphaned. So every tool holds its volume's lock with the worker (`exclusive`), and the
step that runs again after the restart waits for the orphan to finish instead of racing it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

TOOLS = ("losetup", "mkfs.ext4", "e2fsck", "resize2fs", "fsfreeze", "mount", "umount")


class DiskError(Exception):
    pass


@dataclass(frozen=True)
class VolumePaths:
    """Where one volume lives on the worker."""

    root: Path

    @property
    def image(self) -> Path:
        return self.root / "disk.img"

    @property
    def mountpoint(self) -> Path:
        return self.root / "mnt"

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    def snapshot(self, snapshot_id: str) -> Path:
        return self.snapshots / f"{snapshot_id}.img"


def volumes_dir(data_dir: Path) -> Path:
    """Where a worker keeps its volumes, each in a directory of its own."""
    return data_dir / "volumes"


def paths(data_dir: Path, volume_id: str) -> VolumePaths:
    return VolumePaths(volumes_dir(data_dir) / volume_id)


def unsupported_reason() -> str | None:
    """Why this host cannot make volumes (None: it can). Loop devices need root and the tools."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (install util-linux and e2fsprogs)"
    if os.geteuid() != 0:
        return "the worker does not run as root, and loop devices need it"
    if not Path("/dev/loop-control").exists():
        return "no /dev/loop-control: this host (or container) cannot make loop devices"
    return None


_held = threading.local()  # the lock descriptors this thread holds, by volume root
R = TypeVar("R")


@contextmanager
def exclusive(p: VolumePaths) -> Iterator[None]:
    """The volume's lock (re-entered freely by the thread that holds it). Tools started while it
    is held inherit it, so it stays held until they exit, whoever dies first."""
    held: dict[Path, int] = _held.__dict__.setdefault("fds", {})
    if p.root in held:
        yield
        return
    make_root(p)
    fd = os.open(p.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held[p.root] = fd
        yield
    finally:
        held.pop(p.root, None)
        os.close(fd)


def holding(fn: Callable[..., R], p: VolumePaths, *args: Any) -> R:
    """`fn(p, *args)` with the volume's lock held."""
    with exclusive(p):
        return fn(p, *args)


def held() -> tuple[int, ...]:
    """The lock descriptors a tool started now inherits."""
    return tuple(_held.__dict__.get("fds", {}).values())


def _tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, pass_fds=held())


def _run(*argv: str) -> str:
    done = _tool(*argv)
    if done.returncode != 0:
        raise DiskError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def clear_temporary(directory: Path) -> None:
    """Remove what an interrupted step left half-made."""
    if directory.is_dir():
        for leftover in directory.glob("*.tmp"):
            leftover.unlink(missing_ok=True)


def _allocate(fd: int, size: int) -> None:
    """Sparse, on purpose: a fully allocated file (fallocate) writes a little faster through
    the loop device, but a snapshot then copies every block, empty or not, while the volume is
    frozen (ten times longer in bench/volumes.py). `--disk-mb` reserves the whole size anyway."""
    os.ftruncate(fd, size)


def make_root(p: VolumePaths) -> None:
    """The volume's directory: traversable (its machine's user reaches the mount point in it),
    not listable; the disk file and snapshots in it are root's alone."""
    for directory in (p.root.parent, p.root):
        directory.mkdir(exist_ok=True)
        os.chmod(directory, 0o711)


def make_disk(p: VolumePaths, size_mb: int) -> None:
    """A sparse file of `size_mb`, formatted ext4; nothing if it exists already."""
    if p.image.exists():
        return
    make_root(p)
    clear_temporary(p.root)
    tmp = p.image.with_suffix(".img.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        _allocate(f.fileno(), size_mb << 20)
    # no reserved blocks (a volume is all the app's); no discard pass over a fresh sparse file
    _run(
        "mkfs.ext4",
        "-q",
        "-F",
        "-b",
        "4096",
        "-m",
        "0",
        "-E",
        "nodiscard",
        "-L",
        p.root.name[-16:],
        str(tmp),
    )
    with tmp.open("rb+") as f:
        os.fsync(f.fileno())
    tmp.rename(p.image)
    _fsync_dir(p.root)


def copy_snapshot(p: VolumePaths, snapshot: Path) -> None:
    """A new volume's disk as a copy of a snapshot (sparse stays sparse)."""
    if p.image.exists():
        return
    if not snapshot.exists():
        raise DiskError(f"snapshot file {snapshot.name} is gone")
    make_root(p)
    clear_temporary(p.root)
    tmp = p.image.with_suffix(".img.tmp")
    _run("cp", "--sparse=always", str(snapshot), str(tmp))
    with tmp.open("rb+") as f:
        os.fsync(f.fileno())
    tmp.rename(p.image)
    _fsync_dir(p.root)


def loop_devices(image: Path) -> list[str]:
    """Loop devices backed by `image` (one, normally; more only if something else attached it)."""
    if not image.exists():
        return []
    out = _run("losetup", "-n", "-O", "NAME", "-j", str(image))
    return [line.strip() for line in out.splitlines() if line.strip()]


def attach(p: VolumePaths) -> str:
    found = loop_devices(p.image)
    if found:
        return found[0]
    # direct I/O: the loop device reads and writes the file without a second page cache
    return _run("losetup", "--direct-io=on", "-f", "--show", str(p.image)).strip()


def mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [fields[4].replace("\\040", " ") for line in f if len(fields := line.split()) > 4]


def is_mounted(mountpoint: Path) -> bool:
    return str(mountpoint) in mount_points()


def share_volumes(data_dir: Path) -> None:
    """Make the volumes' directory a shared mount of its own (a bind mount onto itself), before
    any volume is mounted in it. A mount namespace made while a volume is mounted (a process
    under `ip netns exec`, a service with a private /tmp) holds a copy of its mount; with the
    copy in a private tree, unmounting the volume here leaves the loop device busy, and an
    offline extend then fails with "in use". In a shared tree the unmount reaches every copy
    that follows it (the slave copies those tools make). DiskError if it cannot be done now:
    volumes mounted there already would be hidden under the new mount."""
    root = volumes_dir(data_dir)
    root.mkdir(mode=0o711, exist_ok=True)
    points = mount_points()
    if str(root) not in points:
        if any(point.startswith(f"{root}/") for point in points):
            raise DiskError("volumes are mounted there already; a restart with none does it")
        _run("mount", "--bind", str(root), str(root))
    _run("mount", "--make-shared", str(root))


def mount(p: VolumePaths) -> None:
    if is_mounted(p.mountpoint):
        return
    device = attach(p)
    p.mountpoint.mkdir(mode=0o700, exist_ok=True)
    _run("mount", "-t", "ext4", "-o", "nodev,nosuid", device, str(p.mountpoint))
    os.chmod(p.mountpoint, 0o700)  # the file system's root: its machine's user's alone


def give_to(p: VolumePaths, uid: int, gid: int) -> None:
    """The volume's root to the user of the machine that mounts it (a container's root maps to
    that user): what the machine writes there, it may write."""
    st = os.lstat(p.mountpoint)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(p.mountpoint, uid, gid)


def unmount(p: VolumePaths) -> None:
    thaw(p)  # a frozen file system cannot be unmounted (a snapshot interrupted by a crash)
    while is_mounted(p.mountpoint):
        _run("umount", str(p.mountpoint))


def detach(p: VolumePaths) -> None:
    for device in loop_devices(p.image):
        _run("losetup", "-d", device)


def release_all(data_dir: Path) -> None:
    """Every volume of a data dir unmounted and its loop device detached, and the volumes'
    shared mount undone: what a worker that goes for good (`souk dev` at its end, a test)
    leaves is files only, which a later worker mounts again."""
    kept = volumes_dir(data_dir.resolve())
    for root in sorted(kept.glob("*")) if kept.exists() else []:
        p = VolumePaths(root)
        try:
            unmount(p)
            detach(p)
        except DiskError:
            pass  # one held elsewhere: the others still go
    while is_mounted(kept):
        _run("umount", str(kept))


def remove(p: VolumePaths) -> None:
    if is_mounted(p.mountpoint):
        raise DiskError(f"{p.mountpoint} is still mounted")
    shutil.rmtree(p.root, ignore_errors=True)


def grow(p: VolumePaths, size_mb: int) -> None:
    """Grow the file, tell the loop device, then the file system (online, while mounted)."""
    grow_file(p, size_mb)
    grow_fs(p)


def grow_file(p: VolumePaths, size_mb: int) -> None:
    if p.image.stat().st_size < size_mb << 20:
        with p.image.open("rb+") as f:
            _allocate(f.fileno(), size_mb << 20)
            os.fsync(f.fileno())


def grow_fs(p: VolumePaths) -> None:
    """Fill the device; nothing to do if it already does. Online when mounted; where the kernel
    refuses that (it needs CAP_SYS_RESOURCE, which some containers drop), offline: unmounted,
    checked, grown, mounted again, which only an unused volume allows."""
    device = attach(p)
    _run("losetup", "-c", device)  # the device takes the file's new size
    if not is_mounted(p.mountpoint):
        _grow_offline(device)
        return
    online = _tool("resize2fs", device)
    if online.returncode == 0:
        return
    if "Permission denied" not in online.stderr:
        raise DiskError(f"resize2fs {device}: {online.stderr.strip()}")
    try:
        _run("umount", str(p.mountpoint))
    except DiskError as exc:
        raise DiskError(
            "this host cannot grow a mounted file system (no CAP_SYS_RESOURCE) and the volume"
            f" is in use ({exc}): stop the machine that mounts it and extend again"
        ) from exc
    _grow_offline(device)
    mount(p)


def _grow_offline(device: str) -> None:
    check = _tool("e2fsck", "-f", "-p", device)
    if check.returncode > 1:  # 1: errors corrected
        raise DiskError(f"e2fsck {device}: {check.stdout.strip()} {check.stderr.strip()}")
    _run("resize2fs", device)


def thaw(p: VolumePaths) -> None:
    if is_mounted(p.mountpoint):
        _tool("fsfreeze", "-u", str(p.mountpoint))


def snapshot(p: VolumePaths, snapshot_id: str) -> int:
    """A consistent copy: the file system is frozen (writes block, nothing half-written is on the
    device) while its file is copied. Returns the bytes the copy takes on disk."""
    dest = p.snapshot(snapshot_id)
    thaw(p)  # a copy interrupted by a crash may have left it frozen
    if not dest.exists():
        p.snapshots.mkdir(mode=0o700, exist_ok=True)
        clear_temporary(p.snapshots)
        tmp = dest.with_suffix(".img.tmp")
        frozen = is_mounted(p.mountpoint)
        if frozen:
            _run("fsfreeze", "-f", str(p.mountpoint))
        try:
            _run("cp", "--sparse=always", str(p.image), str(tmp))
        finally:
            if frozen:
                _run("fsfreeze", "-u", str(p.mountpoint))
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        tmp.rename(dest)
        _fsync_dir(p.snapshots)
    return dest.stat().st_blocks * 512


@dataclass(frozen=True)
class Usage:
    block_size: int
    blocks: int
    blocks_free: int
    blocks_avail: int


def usage(p: VolumePaths) -> Usage | None:
    if not is_mounted(p.mountpoint):
        return None
    st = os.statvfs(p.mountpoint)
    return Usage(st.f_frsize, st.f_blocks, st.f_bfree, st.f_bavail)

"""A machine's root filesystem from unpacked layers: an overlayfs mount over the shared, read-only
layer directories where the host allows it, else a private copy with whiteouts applied.

A container in a user namespace sees its files through the namespace's id mapping, so its root
filesystem must be owned by the app's host ids (`HostUser`), not by the ids the image names. The
shared layers stay as unpacked; overlayfs gets an *idmapped* mount of each (Linux 5.19 and later,
on filesystems that support them), which shows their ids shifted into the app's range without
touching them, and only the machine's own writable layer holds shifted ids. Where the kernel cannot,
the machine gets a private copy, its ids shifted as it is made.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import stat
import subprocess
import threading
import time
from pathlib import Path

from souk.worker.host.identity import HostUser
from souk.worker.oci.unpack import OPAQUE, OPAQUE_XATTR, WHITEOUT

MNT_DETACH = 2
EINVAL = 22
MAX_OPTIONS = 4000  # the kernel reads mount options from one page
NOBODY = 65534  # where ids beyond a user namespace's span end up, as the kernel's overflow id
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_overlay_ok: dict[Path, bool] = {}
_idmap_ok: dict[Path, bool] = {}
_idmap_lock = threading.Lock()  # one probe at a time: two at once shared (and left) its mount
_userns_fds: dict[tuple[int, int, int], int] = {}
_userns_lock = threading.Lock()

# The new mount API (Linux 5.2, mount_setattr 5.12): the same numbers on every architecture but
# alpha, which no worker runs on.
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
AT_FDCWD, AT_EMPTY_PATH = -100, 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_IDMAP = 0x1, 0x100000


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class MountError(OSError):
    pass


def mount_overlay(
    lowers: list[Path], upper: Path, work: Path, merged: Path, user: HostUser | None = None
) -> None:
    """Mount `lowers` (the topmost first) read-only under a writable `upper` at `merged`; with
    `user`, the lowers are seen through idmapped mounts shifting their ids into its range."""
    # Root's, whatever the umask: an app that could write beside them could plant a link where
    # the worker (root) makes, chowns or mounts next. The upper one is the container's `/`.
    for path, mode in ((upper, 0o755), (work, 0o700), (merged, 0o755)):
        own_dir(path, mode)
    if user is None:
        _mount_overlay(lowers, upper, work, merged)
        return
    os.chown(upper, user.uid, user.gid)  # the root directory the container sees
    staging = merged.parent / "layers"
    unmount_layers(staging)
    shifted = []
    try:
        for i, lower in enumerate(lowers):
            shifted.append(staging / str(i))
            own_dir(staging, 0o700)
            own_dir(shifted[-1], 0o700)
            idmapped_mount(lower, shifted[-1], user)
        _mount_overlay(shifted, upper, work, merged)
    finally:
        unmount_layers(staging)  # the overlay keeps its own references to them


def own_dir(path: Path, mode: int) -> None:
    """`path` a directory (made if missing, with its parents) with exactly `mode`, whatever
    the umask; never a link's target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)  # a directory, lstat says: no link to follow


def _mount_overlay(lowers: list[Path], upper: Path, work: Path, merged: Path) -> None:
    lowerdir = ":".join(str(p) for p in lowers)
    options = f"lowerdir={lowerdir},upperdir={upper},workdir={work}"
    if len(options) > MAX_OPTIONS:
        raise MountError(f"overlay options are {len(options)} bytes, over the kernel's limit")
    if _libc.mount(b"overlay", os.fsencode(merged), b"overlay", 0, options.encode()) != 0:
        errno = ctypes.get_errno()
        raise MountError(errno, f"mount overlay at {merged}: {os.strerror(errno)}")


def idmapped_mount(source: Path, target: Path, user: HostUser) -> None:
    """A read-only view of `source` at `target`, ids 0.. shown as `user`'s range."""
    clone = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC
    fd = _syscall("open_tree", SYS_OPEN_TREE, AT_FDCWD, os.fsencode(source), clone)
    try:
        attr = _MountAttr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY, 0, 0, userns_fd(user))
        this = (fd, b"", AT_EMPTY_PATH)
        _syscall("mount_setattr", SYS_MOUNT_SETATTR, *this, ctypes.byref(attr), ctypes.sizeof(attr))
        there = (AT_FDCWD, os.fsencode(target), MOVE_MOUNT_F_EMPTY_PATH)
        _syscall("move_mount", SYS_MOVE_MOUNT, fd, b"", *there)
    finally:
        os.close(fd)


def unmount_layers(staging: Path) -> None:
    """Detach and remove the idmapped layer mounts a rootfs was assembled from (or left behind
    by a crash while it was)."""
    if not staging.is_dir():
        return
    for entry in staging.iterdir():
        if _libc.umount2(os.fsencode(entry), MNT_DETACH) != 0:
            errno = ctypes.get_errno()
            if errno != EINVAL:  # not a mount (any more): nothing to let go
                raise MountError(errno, f"umount {entry}: {os.strerror(errno)}")
        entry.rmdir()
    staging.rmdir()


def _syscall(name: str, number: int, *args: object) -> int:
    """syscall(2) is variadic and reads longs: pass ints as such, not as 32-bit C ints."""
    wide = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = int(_libc.syscall(ctypes.c_long(number), *wide))
    if result < 0:
        errno = ctypes.get_errno()
        raise MountError(errno, f"{name}: {os.strerror(errno)}")
    return result


def userns_fd(user: HostUser) -> int:
    """A user namespace mapping 0.. to `user`'s range, which idmapped mounts are made with: one
    per range for the worker's life, held by this descriptor once the process that made it has
    gone."""
    key = (user.uid, user.gid, user.span)
    with _userns_lock:
        if key not in _userns_fds:
            _userns_fds[key] = _new_userns(user)
        return _userns_fds[key]


def _new_userns(user: HostUser) -> int:
    unshare = shutil.which("unshare") or "unshare"
    proc = subprocess.Popen([unshare, "--user", "cat"], stdin=subprocess.PIPE)
    try:
        mine = os.readlink("/proc/self/ns/user")
        ns = f"/proc/{proc.pid}/ns/user"
        deadline = time.monotonic() + 10
        while os.readlink(ns) == mine:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise MountError(f"could not make a user namespace for uid {user.uid}")
            time.sleep(0.001)
        Path(f"/proc/{proc.pid}/uid_map").write_text(f"0 {user.uid} {user.span}\n")
        Path(f"/proc/{proc.pid}/gid_map").write_text(f"0 {user.gid} {user.span}\n")
        return os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.kill()
        proc.wait()


def unmount(path: Path) -> None:
    if _libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        raise MountError(errno, f"umount {path}: {os.strerror(errno)}")


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:  # paths there escape spaces and such as \\ooo
        return any(codecs.decode(line.split()[4], "unicode_escape") == target for line in f)


def overlay_supported(scratch: Path) -> bool:
    """Try a real overlay mount, with a whiteout and an opaque directory, once per scratch dir."""
    if scratch in _overlay_ok:
        return _overlay_ok[scratch]
    probe = scratch / "overlay-probe"
    ok = False
    try:
        shutil.rmtree(probe, ignore_errors=True)
        lower = probe / "lower"
        (lower / "d").mkdir(parents=True)
        os.setxattr(lower / "d", OPAQUE_XATTR, b"y")
        os.mknod(lower / "gone", stat.S_IFCHR | 0o600, os.makedev(0, 0))
        merged = probe / "merged"
        mount_overlay([lower], probe / "upper", probe / "work", merged)
        try:
            ok = (merged / "d").is_dir() and not (merged / "gone").exists()
        finally:
            unmount(merged)
    except OSError:
        ok = False
    shutil.rmtree(probe, ignore_errors=True)
    _overlay_ok[scratch] = ok
    return ok


def idmap_supported(scratch: Path) -> bool:
    """Whether overlayfs takes idmapped layers here: a real mount, once per scratch dir."""
    with _idmap_lock:
        if scratch not in _idmap_ok:
            _idmap_ok[scratch] = os.geteuid() == 0 and _probe_idmap(scratch)
        return _idmap_ok[scratch]


def _probe_idmap(scratch: Path) -> bool:
    probe = scratch / "idmap-probe"
    user = HostUser(uid=1 << 30, gid=1 << 30, span=NOBODY + 2)  # never an app's: a probe's own
    ok = False
    try:
        shutil.rmtree(probe, ignore_errors=True)
        lower = probe / "lower"
        (lower / "d").mkdir(parents=True)
        os.chown(lower / "d", 7, 8)
        merged = probe / "merged"
        mount_overlay([lower], probe / "upper", probe / "work", merged, user)
        try:
            seen = os.stat(merged / "d")
            ok = (seen.st_uid, seen.st_gid) == (user.uid + 7, user.gid + 8)
        finally:
            unmount(merged)
    except OSError:
        ok = False
    shutil.rmtree(probe, ignore_errors=True)
    return ok


def shifted(host_id: int, base: int, span: int) -> int:
    """An image's id as the app's range holds it on the host (beyond the span: its nobody)."""
    return base + (host_id if host_id < span else min(NOBODY, span - 1))


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _remove(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _is_opaque(directory: Path) -> bool:
    if (directory / OPAQUE).exists():
        return True
    try:
        return os.getxattr(directory, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def merge_copy(layers: list[Path], target: Path, user: HostUser | None = None) -> None:
    """Apply layer directories (the lowest first) onto `target`, as overlayfs would show them;
    with `user`, every id shifted into its range."""
    own_dir(target, 0o755)
    owner = _Owner(user)
    if user is not None:
        os.chown(target, user.uid, user.gid)
    for layer in layers:
        links: dict[tuple[int, int], Path] = {}
        _merge_dir(layer, target, links, owner)


class _Owner:
    """Sets a copied entry's owner: as in the layer, or shifted into a user's range."""

    def __init__(self, user: HostUser | None) -> None:
        self.user = user

    def __call__(self, path: Path, st: os.stat_result) -> None:
        uid, gid = st.st_uid, st.st_gid
        if self.user is not None:
            uid = shifted(uid, self.user.uid, self.user.span)
            gid = shifted(gid, self.user.gid, self.user.span)
        os.lchown(path, uid, gid)


def _merge_dir(src: Path, dst: Path, links: dict[tuple[int, int], Path], owner: _Owner) -> None:
    if _is_opaque(src):
        for child in list(dst.iterdir()):
            _remove(child)
    entries = list(os.scandir(src))
    rest = []
    for entry in entries:  # whiteouts first: they apply to the layers below only
        name, st = entry.name, entry.stat(follow_symlinks=False)
        if name.startswith(WHITEOUT):
            if name != OPAQUE:
                _remove(dst / name[len(WHITEOUT) :])
        elif _is_whiteout(st):
            _remove(dst / name)
        else:
            rest.append((entry, st))
    for entry, st in rest:
        name = entry.name
        out = dst / name
        if stat.S_ISDIR(st.st_mode):
            if not out.is_dir() or out.is_symlink():
                _remove(out)
                out.mkdir()
            _merge_dir(Path(entry.path), out, links, owner)
            owner(out, st)
            shutil.copystat(entry.path, out, follow_symlinks=False)
            continue
        _remove(out)
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in links:
            os.link(links[key], out)
            continue
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(entry.path), out)
        elif stat.S_ISREG(st.st_mode):
            shutil.copy2(entry.path, out, follow_symlinks=False)
        elif stat.S_ISFIFO(st.st_mode):
            os.mkfifo(out, st.st_mode & 0o7777)
        else:
            continue  # nothing else is ever unpacked
        links[key] = out
        owner(out, st)
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(out, st.st_mode & 0o7777)

"""A machine's root filesystem from unpacked layers: an overlayfs mount over the shared, read-only
layer directories where the host allows it, else a private copy with whiteouts applied."""

from __future__ import annotations

import codecs
import ctypes
import ctypes.util
import os
import shutil
import stat
from pathlib import Path

from souk.worker.oci.unpack import OPAQUE, OPAQUE_XATTR, WHITEOUT

MNT_DETACH = 2
MAX_OPTIONS = 4000  # the kernel reads mount options from one page
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_overlay_ok: dict[Path, bool] = {}


class MountError(OSError):
    pass


def mount_overlay(lowers: list[Path], upper: Path, work: Path, merged: Path) -> None:
    """Mount `lowers` (the topmost first) read-only under a writable `upper` at `merged`."""
    lowerdir = ":".join(str(p) for p in lowers)
    options = f"lowerdir={lowerdir},upperdir={upper},workdir={work}"
    if len(options) > MAX_OPTIONS:
        raise MountError(f"overlay options are {len(options)} bytes, over the kernel's limit")
    for path in (upper, work, merged):
        path.mkdir(parents=True, exist_ok=True)
    if _libc.mount(b"overlay", os.fsencode(merged), b"overlay", 0, options.encode()) != 0:
        errno = ctypes.get_errno()
        raise MountError(errno, f"mount overlay at {merged}: {os.strerror(errno)}")


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


def merge_copy(layers: list[Path], target: Path) -> None:
    """Apply layer directories (the lowest first) onto `target`, as overlayfs would show them."""
    target.mkdir(parents=True, exist_ok=True)
    for layer in layers:
        links: dict[tuple[int, int], Path] = {}
        _merge_dir(layer, target, links)


def _merge_dir(src: Path, dst: Path, links: dict[tuple[int, int], Path]) -> None:
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
            _merge_dir(Path(entry.path), out, links)
            shutil.copystat(entry.path, out, follow_symlinks=False)
            os.lchown(out, st.st_uid, st.st_gid)
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
        os.lchown(out, st.st_uid, st.st_gid)
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(out, st.st_mode & 0o7777)

"""Unpack one layer tarball into its own directory without ever writing outside it.

Each layer gets a directory of its own (unpacked once per layer digest, shared by every machine).
Whiteouts are kept in overlayfs form (a 0/0 character device, an opaque xattr) when overlayfs is in
use, else in the tar's own `.wh.` form for the copying merge to apply."""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import IO, cast

from isal import igzip, igzip_lib

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "trusted.overlay.opaque"
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# What a layer that is not a gzip'd tarball raises as it is read (isal's stubs type its own
# error as an instance: its class is named here once).
BAD_LAYER = (
    tarfile.TarError,
    EOFError,
    gzip.BadGzipFile,
    cast(type[Exception], igzip_lib.IsalError),
)


class UnsafeLayer(ValueError):
    """A layer entry that would escape its directory, or that we refuse to create."""


def clean_name(name: str) -> list[str]:
    """The entry's path components relative to the layer root; `..` anywhere is refused."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeLayer(f"entry {name!r} has a '..' component")
    return parts


def climbs_out(parent: list[str], target: str) -> bool:
    """Whether a symlink at `parent/x` pointing at `target` resolves above the root."""
    depth = 0 if target.startswith("/") else len(parent)
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _parent_dir(root: Path, parts: list[str]) -> Path:
    """The entry's parent directory, created as needed; a symlink on the way is refused, since
    following it is how a layer writes outside its root."""
    path = root
    for part in parts:
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            os.mkdir(path, 0o755)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeLayer(f"{'/'.join(parts)!r} passes through a symlink")
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeLayer(f"{'/'.join(parts)!r} passes through a non-directory")
    return path


def _is_whiteout(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _clear(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _decompressed(blob: Path) -> tuple[IO[bytes], subprocess.Popen[bytes] | None, bool]:
    with open(blob, "rb") as f:
        magic = f.read(4)
    if magic.startswith(ZSTD_MAGIC):
        zstd = shutil.which("zstd")
        if not zstd:
            raise UnsafeLayer("zstd-compressed layer and no zstd binary to decompress it")
        proc = subprocess.Popen([zstd, "-dc", str(blob)], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        return proc.stdout, proc, False
    return open(blob, "rb"), None, magic.startswith(GZIP_MAGIC)


def unpack_layer(blob: Path, dest: Path, overlay: bool) -> int:
    """Unpack `blob` (tar, gzip or zstd) into the empty directory `dest`; the bytes written."""
    stream, proc, gzipped = _decompressed(blob)
    try:
        return _unpack(stream, gzipped, dest, overlay)
    finally:
        stream.close()
        if proc is not None and proc.wait() != 0:
            raise UnsafeLayer(f"zstd failed on {blob}")


def unpack_stream(source: GrowingFile, dest: Path, overlay: bool) -> int:
    """`unpack_layer` of a blob as it is downloaded (tar or gzip; `NotStreamable` for zstd,
    which is unpacked from the file once it is complete)."""
    try:
        head = source.read(len(ZSTD_MAGIC))
        while head and len(head) < len(ZSTD_MAGIC) and (more := source.read(len(ZSTD_MAGIC))):
            head += more
        if not head:
            raise NotStreamable("nothing came")
        if head.startswith(ZSTD_MAGIC):
            raise NotStreamable("zstd")
        return _unpack(_Prefixed(head, source), head.startswith(GZIP_MAGIC), dest, overlay)
    finally:
        source.close()


def _unpack(stream: IO[bytes] | _Prefixed, gzipped: bool, dest: Path, overlay: bool) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    dirs: list[tuple[Path, tarfile.TarInfo]] = []
    try:
        # Inflated by ISA-L, not zlib: inflating is most of a layer's unpacking (2.5x faster)
        source = igzip.IGzipFile(fileobj=stream, mode="rb") if gzipped else stream  # type: ignore[no-untyped-call]
        with tarfile.open(fileobj=source, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                total += _entry(tar, member, dest, overlay, dirs)
    except BAD_LAYER as e:
        raise UnsafeLayer(f"layer is not a valid tarball: {e}") from e
    for path, member in reversed(dirs):  # after their contents, so later writes don't undo it
        os.chmod(path, member.mode & 0o7777)
        os.utime(path, (member.mtime, member.mtime))
    return total


class NotStreamable(Exception):
    """This blob is unpacked from its file once downloaded, not as it arrives."""


class GrowingFile:
    """A file the event loop is downloading into, read by an unpacking thread as it grows:
    `grew(path, n)` says its first `n` bytes are there; `end()` that no more will come, and
    `end(error)` that the reader must fail (the download did). A reader that has nothing to read
    waits; one whose file never grew gets `NotStreamable` at the end."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._size = 0
        self._ended = False
        self._error: BaseException | None = None
        self._file: IO[bytes] | None = None
        self._read = 0

    def grew(self, path: Path, size: int) -> None:
        with self._cond:
            if self._file is None:  # now: the file is renamed once complete
                self._file = open(path, "rb")  # noqa: SIM115  (closed by `close`)
            self._size = size
            self._cond.notify()

    def end(self, error: BaseException | None = None) -> None:
        with self._cond:
            self._ended, self._error = True, error
            self._cond.notify()

    def read(self, size: int = -1) -> bytes:
        with self._cond:
            while self._read >= self._size and not self._ended and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise NotStreamable(f"the download failed: {self._error}")
            if self._file is None:
                raise NotStreamable("the file never grew")
            file, available = self._file, self._size - self._read
        if available <= 0:
            return b""
        data = file.read(available if size < 0 else min(size, available))
        self._read += len(data)
        return data

    def close(self) -> None:
        with self._cond:
            if self._file is not None:
                self._file.close()
            self._ended = True
            self._cond.notify_all()


class _Prefixed:
    """`head`, then the rest of `source`: what tarfile reads after the magic was looked at."""

    def __init__(self, head: bytes, source: GrowingFile) -> None:
        self.head, self.source = head, source

    def read(self, size: int = -1) -> bytes:
        if self.head:
            data = self.head if size < 0 else self.head[:size]
            self.head = self.head[len(data) :]
            return data
        return self.source.read(size)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # what ISA-L's reader calls
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.source.close()


def _entry(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    root: Path,
    overlay: bool,
    dirs: list[tuple[Path, tarfile.TarInfo]],
) -> int:
    parts = clean_name(member.name)
    if not parts:
        return 0
    parent = _parent_dir(root, parts[:-1])
    base = parts[-1]
    if base == OPAQUE:
        if overlay:
            os.setxattr(parent, OPAQUE_XATTR, b"y")
        else:
            (parent / OPAQUE).touch()
        return 0
    if base.startswith(WHITEOUT):
        hidden = base[len(WHITEOUT) :]
        if not hidden or hidden in (".", ".."):
            raise UnsafeLayer(f"bad whiteout {member.name!r}")
        if overlay:
            # A whiteout hides lower layers only: what this layer made under that name stays,
            # a directory becoming opaque to keep hiding the lower one's contents.
            target = parent / hidden
            if os.path.isdir(target) and not os.path.islink(target):
                os.setxattr(target, OPAQUE_XATTR, b"y")
            elif not os.path.lexists(target):
                os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        else:
            (parent / base).touch()
        return 0
    path = parent / base
    if member.isdir():
        if not path.is_dir() or path.is_symlink():
            replaced_whiteout = _is_whiteout(path)
            _clear(path)
            os.mkdir(path, 0o755)
            if replaced_whiteout:  # deleted and made anew in this layer
                os.setxattr(path, OPAQUE_XATTR, b"y")
        dirs.append((path, member))
        os.lchown(path, member.uid, member.gid)
        return 0
    _clear(path)
    size = 0
    if member.isreg():
        source = tar.extractfile(member)
        assert source is not None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
        size = member.size
    elif member.issym():
        if climbs_out(parts[:-1], member.linkname):
            raise UnsafeLayer(f"symlink {member.name!r} -> {member.linkname!r} leaves the root")
        os.symlink(member.linkname, path)
    elif member.islnk():
        target_parts = clean_name(member.linkname)
        if not target_parts:
            raise UnsafeLayer(f"hard link {member.name!r} to the root")
        target = _parent_dir(root, target_parts[:-1]) / target_parts[-1]
        if not os.path.lexists(target) or (os.path.isdir(target) and not target.is_symlink()):
            raise UnsafeLayer(f"hard link {member.name!r} to missing {member.linkname!r}")
        os.link(target, path, follow_symlinks=False)
        return 0  # shares its target's inode and ownership
    elif member.isfifo():
        os.mkfifo(path, 0o600)
    else:
        raise UnsafeLayer(f"entry {member.name!r} is a device node or unknown type {member.type!r}")
    os.lchown(path, member.uid, member.gid)
    if not member.issym():
        os.chmod(path, member.mode & 0o7777)
    os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
    return size

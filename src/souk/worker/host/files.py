"""`config.files`: files written into a machine before each start.

Each goes below a root the driver names: a container's root filesystem, or a host command's
working directory (a host command has no root of its own, so `/etc/app.conf` becomes
`etc/app.conf` there). The root belongs to the app, which may have put symbolic links in it in
an earlier run: every directory on the way is opened without following links, and the file is
written beside its final name and renamed over it, so nothing is ever written outside the root.
Files and the directories made for them belong to the app's host user (a container's root).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from souk.models.machine import MachineFile

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileRefused(OSError):
    """A file that cannot be written where its guest_path says."""


def write_files(
    root: Path,
    files: Iterable[MachineFile],
    secrets: Mapping[str, str],
    owner: tuple[int, int] | None = None,
) -> None:
    """Write every file below `root`, owned by `owner` (uid, gid) when given."""
    for file in files:
        parts = [p for p in file.guest_path.split("/") if p]
        try:
            _write_one(root, parts, file.content(secrets), file.file_mode(), owner)
        except KeyError:
            raise FileRefused(f"files: {file.guest_path}: no secret {file.secret_name}") from None
        except OSError as exc:
            raise FileRefused(
                f"files: cannot write {file.guest_path}: {exc.strerror or exc}"
                " (a directory on the way is a link, or not a directory)"
            ) from None


def _write_one(
    root: Path, parts: list[str], content: bytes, mode: int, owner: tuple[int, int] | None
) -> None:
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        name = parts[-1]
        tmp = f".{name}.souk-new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(tmp, flags, 0o600, dir_fd=fd)
        try:
            if owner is not None:
                os.fchown(out, *owner)
            os.fchmod(out, mode)
            view = memoryview(content)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)  # over a link, never through it
    finally:
        os.close(fd)

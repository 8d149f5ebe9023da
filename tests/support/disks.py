"""File systems that fill up or turn read-only on demand: a small tmpfs mounted for one test
(root only; the test is skipped elsewhere), and a file that eats its free space."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

needs_mount = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a tmpfs needs root"
)


@contextlib.contextmanager
def tmpfs(path: Path, options: str = "size=16m") -> Iterator[Path]:
    """A tmpfs at `path` (made here) for the block; skips the test where it cannot be mounted."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def fill(directory: Path) -> Path:
    """A file eating every byte left on the file system; unlink it to free them."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 512, 1):
            block = bytes(size)
            try:
                while True:
                    os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler

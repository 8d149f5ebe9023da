"""A guest's disks: the image's layers made into one ext4 file once per image digest, shared
read-only by every machine of that image, and each machine's own writable layer over it (a
qcow2 file whose backing file is the shared one: what the guest writes stays in the machine's
directory, and goes with it).

The ext4 file is made by `mkfs.ext4 -d` from the merged layers (no loop mount, no root needed
for it), a quarter larger than what it holds and never smaller than MIN_MB, so the guest has
room to write before its overlay grows. The image's /etc/passwd and /etc/group are kept beside
it: the image's user is resolved on the host, as the runc driver does."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from souk.worker.oci.images import Image, ImageCache
from souk.worker.oci.rootfs import merge_copy
from souk.worker.threads import to_thread_to_its_end

MIN_MB = 64
FREE_SHARE = 0.25  # of what the image holds, left free for the guest's writes
INODE_SLACK = 4096


class DiskError(RuntimeError):
    pass


def disks_dir(images: ImageCache) -> Path:
    return images.store.root / "vm"


def base_paths(images: ImageCache, digest: str) -> tuple[Path, Path]:
    """(the image's ext4 file, the directory holding its /etc/passwd and /etc/group)."""
    name = digest.replace(":", "-")
    return disks_dir(images) / f"{name}.ext4", disks_dir(images) / f"{name}.etc"


async def base_image(images: ImageCache, image: Image) -> Path:
    """The image's shared ext4 file, made once (however many machines ask at the same time)."""
    disk, _ = base_paths(images, image.digest)
    if disk.exists():
        return disk
    layers = [images.store.layer_path(d) for d in image.layers]
    await images.store.flights.run(f"ext4:{image.digest}", lambda: _made(images, image, layers))
    return disk


async def _made(images: ImageCache, image: Image, layers: list[Path]) -> None:
    disk, etc = base_paths(images, image.digest)
    if disk.exists():
        return
    await to_thread_to_its_end(_make, disk, etc, layers)


def _make(disk: Path, etc: Path, layers: list[Path]) -> None:
    disk.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    scratch = disk.parent / f".{uuid.uuid4().hex}"
    try:
        tree = scratch / "tree"
        merge_copy(layers, tree)
        size, files = _usage(tree)
        size_mb = max(MIN_MB, int(size * (1 + FREE_SHARE)) // (1 << 20) + 16)
        tmp = scratch / "disk.ext4"
        argv = ["mkfs.ext4", "-q", "-F", "-d", str(tree), "-N", str(files + INODE_SLACK)]
        argv += ["-E", "root_owner=0:0", "-L", "souk-root", str(tmp), f"{size_mb}M"]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DiskError(f"mkfs.ext4: {done.stderr.strip()}")
        tmp.chmod(0o444)  # shared by every machine of the image: none may write it
        kept = scratch / "etc"
        kept.mkdir()
        for name in ("passwd", "group"):
            source = tree / "etc" / name
            if source.is_file() and not source.is_symlink():
                shutil.copyfile(source, kept / name)
        if etc.exists():
            shutil.rmtree(etc)
        os.replace(kept, etc)
        os.replace(tmp, disk)  # last: what is named is whole
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _usage(tree: Path) -> tuple[int, int]:
    """Bytes (in 4 KiB blocks, as ext4 keeps them) and entries below `tree`."""
    size, files = 0, 0
    for root, dirs, names in os.walk(tree):
        for name in [*dirs, *names]:
            st = os.lstat(os.path.join(root, name))
            size += (st.st_size + 4095) // 4096 * 4096 + 256
            files += 1
    return size, files


def collect(images: ImageCache) -> list[str]:
    """Drop the ext4 files (and their /etc copies) of images the cache no longer holds: the
    cache's GC evicts an image's blobs and layers, not what this driver made of them. An image
    a machine uses is pinned, so the cache keeps it, and its ext4 file stays."""
    dropped = []
    for disk in disks_dir(images).glob("sha256-*.ext4"):
        digest = disk.stem.replace("-", ":", 1)
        if images.store.image(digest) is None:
            disk.unlink(missing_ok=True)
            shutil.rmtree(base_paths(images, digest)[1], ignore_errors=True)
            dropped.append(digest)
    return dropped


async def overlay(base: Path, path: Path, owner: tuple[int, int] | None) -> None:
    """The machine's writable layer over `base`, kept while it names the same base (beside it,
    `<path>.base` says which), made anew over another (the machine's image changed)."""
    named = path.with_name(path.name + ".base")
    if path.exists() and named.exists() and named.read_text() == str(base):
        return
    path.unlink(missing_ok=True)
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base), str(path)]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise DiskError(f"qemu-img create: {err.decode().strip()}")
    path.chmod(0o600)
    if owner is not None:
        os.chown(path, *owner)
    named.write_text(str(base))

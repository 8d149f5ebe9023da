"""The worker's content-addressed image store: blobs by digest, layers unpacked once per digest,
one record per image, pins for the images machines use, and LRU garbage collection to a budget.

Layout under the root: blobs/sha256/<hex>, layers/<hex>/ (+ <hex>.size), images/<hex>.json,
pins/<key>.json, tmp/ for downloads in progress, trash/ for what GC is deleting."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar, cast

T = TypeVar("T")

LAST_USE_GRAIN = 60.0  # seconds: how fine an image's last use is kept, for the cache's LRU


@dataclass
class ImageRecord:
    digest: str  # of the platform manifest
    config: str
    layers: list[str]
    names: list[str] = field(default_factory=list)  # references it was pulled as
    last_used: float = 0.0

    @property
    def blobs(self) -> list[str]:
        return [self.digest, self.config, *self.layers]


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    write_private(tmp, json.dumps(value, sort_keys=True).encode())
    os.replace(tmp, path)


def write_private(path: Path, data: bytes) -> None:
    """A new file of the cache's, 0600 whatever the umask (what images the worker runs, and
    for whom, is nobody else's business)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(fd, 0o600)
        out.write(data)


class SingleFlight:
    """Concurrent calls with one key share one run of the work."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[object]] = {}

    def running(self, key: str) -> bool:
        return key in self._running

    async def run(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        if key in self._running:
            return cast(T, await asyncio.shield(self._running[key]))
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            result = await work()
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: waiters may not exist
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._running[key]


class BlobStore:
    def __init__(
        self,
        root: Path,
        budget: int | None = None,
        in_use: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        """`budget` caps bytes on disk (blobs and unpacked layers) after GC; `in_use` names the
        image digests machines use besides the pinned ones (the worker's own view)."""
        self.root = root
        self.budget = budget
        self.in_use = in_use
        self.busy: Counter[str] = Counter()  # blob digests a pull is working on
        self.flights = SingleFlight()
        for sub in ("blobs", "blobs/sha256", "layers", "images", "pins", "tmp", "trash"):
            (root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        for leftover in (root / "trash").iterdir():
            shutil.rmtree(leftover, ignore_errors=True)

    # -- blobs and layers ------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / _hex(digest)

    def layer_path(self, digest: str) -> Path:
        return self.root / "layers" / _hex(digest)

    def tmp_path(self, digest: str) -> Path:
        return self.root / "tmp" / _hex(digest)

    def layer_size(self, digest: str) -> int | None:
        """Bytes unpacked, once the layer is completely unpacked; else None."""
        marker = self.root / "layers" / f"{_hex(digest)}.size"
        return int(marker.read_text()) if marker.exists() else None

    def mark_unpacked(self, digest: str, size: int) -> None:
        _write_json(self.root / "layers" / f"{_hex(digest)}.size", size)

    # -- images ----------------------------------------------------------------------------

    def _image_file(self, digest: str) -> Path:
        return self.root / "images" / f"{_hex(digest)}.json"

    def image(self, digest: str) -> ImageRecord | None:
        try:
            return ImageRecord(**json.loads(self._image_file(digest).read_text()))
        except FileNotFoundError:
            return None

    def images(self) -> list[ImageRecord]:
        found = []
        for path in (self.root / "images").glob("*.json"):
            try:
                found.append(ImageRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                continue
        return found

    def find(self, name: str) -> ImageRecord | None:
        return max(
            (r for r in self.images() if name in r.names), key=lambda r: r.last_used, default=None
        )

    def save(self, record: ImageRecord, name: str | None = None) -> ImageRecord:
        """Record (or refresh) an image, used now, known as `name` too. A last use within
        `LAST_USE_GRAIN` is not written again: the LRU needs no finer, and every start of a
        cached image would otherwise write a file."""
        now = time.time()
        if (not name or name in record.names) and 0 <= now - record.last_used < LAST_USE_GRAIN:
            return record
        if name and name not in record.names:
            record.names.append(name)
        record.last_used = now
        _write_json(self._image_file(record.digest), asdict(record))
        return record

    def size_of(self, record: ImageRecord) -> int:
        return sum(self._sizes(set(record.blobs), set(record.layers)).values())

    # -- pins ------------------------------------------------------------------------------

    def _pin_file(self, holder: str) -> Path:
        return self.root / "pins" / f"{hashlib.sha256(holder.encode()).hexdigest()[:32]}.json"

    def pin(self, digest: str, holder: str) -> None:
        """Keep this image while `holder` (a machine's root filesystem) uses it; survives
        restarts, so a worker that crashed still protects its machines' images."""
        _write_json(self._pin_file(holder), {"holder": holder, "digest": digest})

    def unpin(self, holder: str) -> None:
        self._pin_file(holder).unlink(missing_ok=True)

    def pinned(self) -> set[str]:
        found = set()
        for path in (self.root / "pins").glob("*.json"):
            try:
                found.add(json.loads(path.read_text())["digest"])
            except (OSError, ValueError, KeyError):
                continue
        if self.in_use is not None:
            found.update(self.in_use())
        return found

    # -- garbage collection ----------------------------------------------------------------

    def _sizes(self, blobs: set[str], layers: set[str]) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for digest in blobs:
            try:
                sizes[f"blob:{digest}"] = self.blob_path(digest).stat().st_size
            except FileNotFoundError:
                pass
        for digest in layers:
            sizes[f"layer:{digest}"] = self.layer_size(digest) or 0
        return sizes

    def _on_disk(self) -> tuple[set[str], set[str]]:
        blobs = {f"sha256:{p.name}" for p in (self.root / "blobs" / "sha256").iterdir()}
        layers = {
            f"sha256:{p.name}" for p in (self.root / "layers").iterdir() if p.suffix != ".size"
        }
        return blobs, layers

    def usage(self) -> int:
        return sum(self._sizes(*self._on_disk()).values())

    def collect(self, budget: int | None = None) -> list[str]:
        """Evict least recently used images not in use until within budget, and every blob or
        layer no remaining image needs; returns the evicted image digests. Files go to trash/
        here (so no later pull can see them half deleted); `empty_trash` deletes them."""
        budget = self.budget if budget is None else budget
        keep = self.pinned()
        images = sorted(self.images(), key=lambda r: r.last_used)
        on_blobs, on_layers = self._on_disk()
        evicted: list[ImageRecord] = []

        def needed(remaining: list[ImageRecord]) -> tuple[set[str], set[str]]:
            blobs = {d for r in remaining for d in r.blobs} | set(self.busy)
            layers = {d for r in remaining for d in r.layers} | set(self.busy)
            return blobs & on_blobs, layers & on_layers

        remaining = list(images)
        if budget is not None:
            for record in images:
                if sum(self._sizes(*needed(remaining)).values()) <= budget:
                    break
                if record.digest in keep or self.busy[record.digest]:
                    continue
                remaining.remove(record)
                evicted.append(record)
        blobs, layers = needed(remaining)
        for record in evicted:
            self._image_file(record.digest).unlink(missing_ok=True)
        for digest in on_blobs - blobs:
            self._trash(self.blob_path(digest))
        for digest in on_layers - layers:
            (self.root / "layers" / f"{_hex(digest)}.size").unlink(missing_ok=True)
            self._trash(self.layer_path(digest))
        for path in (self.root / "tmp").iterdir():  # what a failed or abandoned pull left
            if not self.busy[f"sha256:{path.name.partition('.')[0]}"]:
                self._trash(path)
        return [r.digest for r in evicted]

    def _trash(self, path: Path) -> None:
        try:
            os.replace(path, self.root / "trash" / uuid.uuid4().hex)
        except FileNotFoundError:
            pass

    def empty_trash(self) -> None:
        for path in (self.root / "trash").iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

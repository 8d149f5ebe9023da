"""The worker's image cache: what the worker calls to pull an image and to give a machine a root
filesystem from it. Pulls of one image run once however many machines ask at the same time."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from souk.worker.host.identity import HostUser
from souk.worker.oci.config import ImageConfig
from souk.worker.oci.manifest import Descriptor
from souk.worker.oci.reference import ImageRef
from souk.worker.oci.registry import FetchProgress, RegistryClient, Resolved, Restarted, fetching
from souk.worker.oci.rootfs import (
    idmap_supported,
    is_mounted,
    merge_copy,
    mount_overlay,
    overlay_supported,
    own_dir,
    unmount,
    unmount_layers,
)
from souk.worker.oci.store import BlobStore, ImageRecord, write_private
from souk.worker.oci.unpack import GrowingFile, NotStreamable, unpack_layer, unpack_stream
from souk.worker.threads import to_thread_to_its_end


@dataclass(frozen=True)
class Image:
    digest: str  # of the platform manifest: what pins, GC and the catalog name it by
    name: str  # the canonical reference it was pulled as
    config: ImageConfig
    layers: tuple[str, ...]  # layer digests, the lowest first
    size: int  # bytes on disk: compressed blobs and unpacked layers


@dataclass(frozen=True)
class CachedImage:
    """One row of what this worker has cached, as the catalog's `images` table wants it."""

    digest: str
    ref: str
    size: int
    last_used: float


class ImageCache:
    def __init__(
        self,
        root: Path,
        client: RegistryClient,
        *,
        budget: int | None = None,
        in_use: Callable[[], Iterable[str]] | None = None,
        parallel: int = 4,
        overlay: bool | None = None,
    ) -> None:
        """`root` is this worker's image directory; `budget` caps its bytes (checked after every
        pull); `in_use` returns the image digests running machines use; `overlay` forces or
        forbids overlayfs (default: use it when a probe mount works)."""
        self.client = client
        self.store = BlobStore(root, budget, in_use)
        self.parallel = parallel
        self.overlay = overlay_supported(root / "tmp") if overlay is None else overlay
        self._idmap: bool | None = None
        self.downloads = 0  # blobs fetched from a registry, for tests and metrics
        self._check_layer_format(root)

    def _check_layer_format(self, root: Path) -> None:
        """Layers unpacked for overlayfs and for copying differ in their whiteouts: drop those
        unpacked the other way."""
        marker = root / "layer-format"
        want = "overlay" if self.overlay else "copy"
        if marker.exists() and marker.read_text() != want:
            for path in (root / "layers").iterdir():
                os.replace(path, root / "trash" / uuid.uuid4().hex)
            self.store.empty_trash()
        write_private(marker, want.encode())

    # -- pulling ---------------------------------------------------------------------------

    async def pull(self, reference: str, digest: str | None = None) -> Image:
        """Pull `reference` (`registry/name:tag` or `...@sha256:`) unless cached; by tag, the
        registry is asked which digest the tag names now (the cached copy is used if the registry
        cannot be reached). `digest`: the image the tag named when a machine's version first
        started, run again whatever the tag names now: from the cache without asking the
        registry anything, else fetched by that digest. Either way it is known as `reference`."""
        name = self.client.parse(reference)
        ref = name.with_digest(digest) if digest else name
        with fetching(ref):
            return await self.store.flights.run(f"pull:{ref}", lambda: self._pull(ref, str(name)))

    async def resolve(self, reference: str) -> str:
        """`reference` pinned: the digest its tag names now added to it, as a deploy sends it
        to every machine of a release (one image everywhere, and no lookup when each starts).
        The digest is the tag's own (an index's, for a multi-platform image), so every worker
        still picks its platform. A reference with a digest is returned as it is, unasked."""
        ref = self.client.parse(reference)
        if ref.digest:
            return str(ref)
        with fetching(ref):
            _, _, digest = await self.client.get_manifest(ref, ref.reference)
        return str(ref.with_digest(digest))

    async def _pull(self, ref: ImageRef, name: str) -> Image:
        if ref.digest and (cached := self.store.image(ref.digest) or self.store.find(str(ref))):
            return self._image(self.store.save(cached, name))
        try:
            resolved = await self.client.resolve(ref)
        except (aiohttp.ClientConnectionError, TimeoutError):
            if (cached := self.store.find(str(ref))) is None:
                raise
            return self._image(self.store.save(cached, name))
        record = self.store.image(resolved.digest)
        if record is not None and self._complete(record):  # nothing to fetch: nothing to GC
            return self._image(self.store.save(record, name))
        try:
            record = self.store.save(await self._fetch(resolved), name)
        finally:
            await self.gc()  # to budget, and whatever a failed pull left behind
        return self._image(record)

    def _complete(self, record: ImageRecord) -> bool:
        return all(self.store.blob_path(d).exists() for d in record.blobs) and all(
            self.store.layer_size(d) is not None for d in record.layers
        )

    async def _fetch(self, resolved: Resolved) -> ImageRecord:
        manifest = resolved.manifest
        busy = [resolved.digest, manifest.config.digest, *(x.digest for x in manifest.layers)]
        self.store.busy.update(busy)
        try:
            path = self.store.blob_path(resolved.digest)
            if not path.exists():
                partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
                write_private(partial, resolved.raw)  # verified against its digest already
                os.replace(partial, path)
            # The config and the layers are fetched at once, each layer unpacked as it arrives;
            # a broken config is refused before any layer is kept.
            config_ok = asyncio.get_running_loop().create_future()
            limit = asyncio.Semaphore(self.parallel)

            async def config() -> None:
                try:
                    path = await self._blob(resolved.ref, manifest.config)
                    ImageConfig.parse(path.read_bytes())
                except BaseException as e:
                    config_ok.set_exception(e)
                    config_ok.exception()  # retrieved: there may be no layer to wait on it
                    raise
                config_ok.set_result(None)

            async def layer(blob: Descriptor) -> None:
                async with limit:
                    await self._layer(resolved.ref, blob, config_ok)

            try:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(config())
                    for blob in manifest.layers:
                        tasks.create_task(layer(blob))
            except ExceptionGroup as group:  # the first failure is the one worth reporting
                raise group.exceptions[0] from None
        finally:
            self.store.busy.subtract(busy)
            self.store.busy += Counter()  # drops the zero counts
        layers = [x.digest for x in manifest.layers]
        return ImageRecord(resolved.digest, manifest.config.digest, layers)

    async def _blob(
        self, ref: ImageRef, blob: Descriptor, progress: FetchProgress | None = None
    ) -> Path:
        path = self.store.blob_path(blob.digest)

        async def download() -> Path:
            if not path.exists():
                tmp = self.store.tmp_path(blob.digest)
                await self.client.download_blob(ref, blob, tmp, progress)
                os.chmod(tmp, 0o600)  # written with the umask's mode
                os.replace(tmp, path)
                self.downloads += 1
            return path

        return path if path.exists() else await self.store.flights.run(blob.digest, download)

    async def _layer(
        self, ref: ImageRef, blob: Descriptor, config_ok: asyncio.Future[None]
    ) -> None:
        """Download a layer and unpack it as it arrives, or from its file where it cannot be
        (zstd, a registry that ignores Range, a blob here already or being downloaded for another
        pull); kept once its image's config is known to be good."""
        digest = blob.digest

        async def unpacked() -> None:
            if self.store.layer_size(digest) is not None:
                await self._blob(ref, blob)
                await asyncio.shield(config_ok)
                return
            tmp = self.store.tmp_path(digest).with_suffix(f".unpack-{uuid.uuid4().hex}")
            try:
                size = await self._unpack_streaming(ref, blob, tmp)
                if size is None:  # from the file, then
                    blob_path = await self._blob(ref, blob)
                    await to_thread_to_its_end(shutil.rmtree, tmp, True)
                    size = await to_thread_to_its_end(unpack_layer, blob_path, tmp, self.overlay)
                await asyncio.shield(config_ok)  # a broken config: no layer of it is kept
                self._keep_unpacked(digest, tmp, size)
            finally:
                if tmp.exists():
                    await asyncio.to_thread(shutil.rmtree, tmp, True)

        if self.store.layer_size(digest) is None:
            await self.store.flights.run(f"unpack:{digest}", unpacked)
        else:
            await self._blob(ref, blob)

    async def _unpack_streaming(self, ref: ImageRef, blob: Descriptor, tmp: Path) -> int | None:
        """The layer unpacked into `tmp` while it downloads; None: not done (it must be
        unpacked from its file). Nothing unpacked is kept unless the blob's digest is right."""
        if self.store.blob_path(blob.digest).exists() or self.store.flights.running(blob.digest):
            return None
        growing = GrowingFile()
        work = asyncio.ensure_future(
            to_thread_to_its_end(unpack_stream, growing, tmp, self.overlay)
        )
        try:
            try:
                await self._blob(ref, blob, growing.grew)
            except Restarted as e:
                growing.end(e)
                await asyncio.wait([work])
                return None
            except BaseException as e:
                growing.end(e)
                await asyncio.wait([work])
                raise
            growing.end()
            try:
                return await work
            except NotStreamable:
                return None
        finally:
            if work.done() and not work.cancelled():
                work.exception()  # retrieved: the download's failure is the one raised
            growing.close()

    def _keep_unpacked(self, digest: str, tmp: Path, size: int) -> None:
        final = self.store.layer_path(digest)
        if final.exists():  # half unpacked before a crash
            os.replace(final, self.store.root / "trash" / uuid.uuid4().hex)
        os.replace(tmp, final)
        self.store.mark_unpacked(digest, size)

    def _image(self, record: ImageRecord) -> Image:
        config = ImageConfig.parse(self.store.blob_path(record.config).read_bytes())
        name = record.names[-1] if record.names else record.digest
        size = self.store.size_of(record)
        return Image(record.digest, name, config, tuple(record.layers), size)

    # -- root filesystems ------------------------------------------------------------------

    async def idmap(self) -> bool:
        """Whether overlayfs takes idmapped layers here (probed on first use: only containers
        in a user namespace need them); if not, such a container gets a shifted copy."""
        if self._idmap is None:
            scratch = self.store.root / "tmp"
            self._idmap = self.overlay and await asyncio.to_thread(idmap_supported, scratch)
        return self._idmap

    async def prepare_rootfs(
        self, image: Image, workdir: Path, user: HostUser | None = None
    ) -> Path:
        """A writable root filesystem of `image` for one machine, in `workdir` (the machine's
        own directory for it); idempotent, and pins the image until `release_rootfs`. With
        `user`, it is owned by that user's range (for a container in a user namespace). One
        made of another image (the machine's version before an update) is released first,
        with what was written to it: kept, it would run the old files under the new config."""
        own_dir(workdir, 0o711)  # root's, passable: the container's root reaches rootfs/
        rootfs, made_of = workdir / "rootfs", _made_of(workdir)
        if made_of != image.digest and rootfs.exists():
            await self.release_rootfs(workdir)
        if made_of != image.digest:
            self.store.pin(image.digest, str(workdir))
        layers = [self.store.layer_path(d) for d in image.layers]
        missing = [d for d in image.layers if self.store.layer_size(d) is None]
        if missing:
            raise FileNotFoundError(f"layers of {image.name} are not unpacked: {missing}")
        if self.overlay and (user is None or await self.idmap()):
            if not is_mounted(rootfs):
                empty = self.store.root / "empty"
                empty.mkdir(mode=0o700, exist_ok=True)
                lowers = list(reversed(layers)) or [empty]
                upper, work = workdir / "upper", workdir / "work"
                await asyncio.to_thread(mount_overlay, lowers, upper, work, rootfs, user)
        else:
            done = workdir / "rootfs.done"
            if not done.exists():
                if rootfs.exists():
                    await asyncio.to_thread(shutil.rmtree, rootfs)
                await asyncio.to_thread(merge_copy, layers, rootfs, user)
                done.touch()
        if made_of != image.digest:  # written last: what it names is whole
            made = json.dumps({"digest": image.digest, "ref": image.name})
            write_private(workdir / "image.json", made.encode())
        return rootfs

    async def release_rootfs(self, workdir: Path) -> None:
        """Unmount and delete a machine's root filesystem, and unpin its image."""
        rootfs = workdir / "rootfs"
        if is_mounted(rootfs):
            await asyncio.to_thread(unmount, rootfs)
        await asyncio.to_thread(unmount_layers, workdir / "layers")
        for name in ("rootfs", "upper", "work"):
            await asyncio.to_thread(shutil.rmtree, workdir / name, True)
        for name in ("rootfs.done", "image.json"):
            (workdir / name).unlink(missing_ok=True)
        self.store.unpin(str(workdir))

    # -- reporting and GC ------------------------------------------------------------------

    def cached(self) -> list[CachedImage]:
        """Every complete image on disk, for the catalog's `images` rows."""
        rows = []
        for record in self.store.images():
            if self._complete(record):
                ref = record.names[-1] if record.names else ""
                size = self.store.size_of(record)
                rows.append(CachedImage(record.digest, ref, size, record.last_used))
        return sorted(rows, key=lambda r: -r.last_used)

    def has(self, digest_or_ref: str) -> bool:
        """Whether an image is cached, by manifest digest or by the reference it was pulled as
        (a pinned one also by its digest, as a start would find it)."""
        if digest_or_ref.startswith("sha256:"):
            record = self.store.image(digest_or_ref)
        else:
            ref = self.client.parse(digest_or_ref)
            pinned = self.store.image(ref.digest) if ref.digest else None
            record = pinned or self.store.find(str(ref))
        return record is not None and self._complete(record)

    async def gc(self, budget: int | None = None) -> list[str]:
        """Evict unused images, least recently used first, down to the budget."""
        evicted = self.store.collect(budget)
        await asyncio.to_thread(self.store.empty_trash)
        return evicted


def _made_of(workdir: Path) -> str | None:
    """The digest of the image a machine's root filesystem in `workdir` was made of, if whole."""
    try:
        made = json.loads((workdir / "image.json").read_text())
    except (OSError, ValueError):
        return None
    digest = made.get("digest") if isinstance(made, dict) else None
    return digest if isinstance(digest, str) else None

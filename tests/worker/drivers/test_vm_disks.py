"""The vm driver's ext4 files follow the image cache: one whose image the cache evicted is
dropped, one whose image is still held is kept."""

from __future__ import annotations

from pathlib import Path

from souk.worker.drivers import vm_rootfs
from souk.worker.oci.images import ImageCache
from souk.worker.oci.registry import RegistryClient, RegistryConfig
from souk.worker.oci.store import ImageRecord


async def test_ext4_files_of_evicted_images_are_dropped(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "images", RegistryClient(RegistryConfig()), overlay=False)
    try:
        held, gone = "sha256:" + "a" * 64, "sha256:" + "b" * 64
        cache.store.save(ImageRecord(held, "sha256:" + "c" * 64, []), "r.example/held:1")
        for digest in (held, gone):
            disk, etc = vm_rootfs.base_paths(cache, digest)
            disk.parent.mkdir(parents=True, exist_ok=True)
            disk.write_bytes(b"ext4")
            etc.mkdir()
        assert vm_rootfs.collect(cache) == [gone]
        assert vm_rootfs.base_paths(cache, held)[0].exists()
        assert not any(p.exists() for p in vm_rootfs.base_paths(cache, gone))
    finally:
        await cache.client.close()

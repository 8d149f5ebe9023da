"""The image cache's contents, mirrored into the log, so the catalog (and through it, placement's
cached-image bonus) learns of pulls and evictions."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from souk.worker.state import queries
from souk.worker.state.store import Store, Tx

if TYPE_CHECKING:
    from souk.worker.oci.images import ImageCache


async def sync_images(store: Store, cache: ImageCache | None) -> None:
    """Log what the cache holds now that the log does not, and what it no longer holds."""
    if cache is None:
        return
    cached = {image.digest: image for image in await asyncio.to_thread(cache.cached)}

    def apply(tx: Tx) -> None:
        logged = queries.image_digests(tx)
        for digest in logged - cached.keys():
            tx.log("image", digest, "cache", "evicted")
            queries.delete_image(tx, digest)
        for digest in cached.keys() - logged:
            image = cached[digest]
            queries.insert_image(tx, digest, image.ref, image.size)
            tx.log("image", digest, "cache", "pulled", data={"ref": image.ref})

    await store.write(apply)

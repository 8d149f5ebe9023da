"""The image store's records: an image used again within the grain of its last use is not
written again (each start of a cached image would write a file), and is past it."""

from __future__ import annotations

import time
from pathlib import Path

from souk.worker.oci.store import LAST_USE_GRAIN, BlobStore, ImageRecord

DIGEST = "sha256:" + "a" * 64


def test_a_last_use_is_written_once_per_grain_and_a_new_name_at_once(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    store.save(ImageRecord(DIGEST, "sha256:" + "b" * 64, []), "r.test/app:1")
    written = store.image(DIGEST)
    assert written is not None and written.names == ["r.test/app:1"]
    first = written.last_used
    again = store.save(written, "r.test/app:1")  # used again at once: nothing written
    stored = store.image(DIGEST)
    assert again.last_used == first and stored is not None and stored.last_used == first
    renamed = store.save(stored, "r.test/app:2")  # a new name is written whatever the time
    stored = store.image(DIGEST)
    assert stored is not None and stored.names == ["r.test/app:1", "r.test/app:2"]
    assert renamed.last_used >= first
    stored.last_used = time.time() - LAST_USE_GRAIN - 1  # a use long ago: this one counts
    store.save(stored)
    latest = store.image(DIGEST)
    assert latest is not None and latest.last_used > time.time() - LAST_USE_GRAIN

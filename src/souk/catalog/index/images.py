"""Image rows: per worker by digest, and each image's holders, by digest and by the reference it
was pulled as, so that a create naming an image finds its holders without reading the region."""

from __future__ import annotations

from collections import defaultdict

from souk.catalog.index.base import TableIndex, register
from souk.models.catalog import ImageRow, Row


@register
class ImageIndex(TableIndex):
    table = "images"
    key_field = "digest"

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, ImageRow]] = defaultdict(dict)  # owner -> digest -> row
        # image -> its holders, each with how many of its rows name it (a tag pulled again under
        # a new digest is a second row)
        self.holders: dict[str, dict[str, int]] = {}

    def put(self, owner: str, key: str, row: Row | None) -> None:
        was = self.rows[owner].pop(key, None)
        if was is not None:
            self._hold(owner, was, -1)
        if isinstance(row, ImageRow):
            self.rows[owner][key] = row
            self._hold(owner, row, 1)

    def get(self, owner: str, key: str) -> Row | None:
        return self.rows.get(owner, {}).get(key)

    def _hold(self, owner: str, row: ImageRow, step: int) -> None:
        for name in {row.digest, row.ref} - {""}:
            holders = self.holders.setdefault(name, {})
            count = holders.get(owner, 0) + step
            if count > 0:
                holders[owner] = count
            else:
                holders.pop(owner, None)
                if not holders:
                    del self.holders[name]

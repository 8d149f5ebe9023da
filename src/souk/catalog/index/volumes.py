"""Volume rows, by id; each written by the worker that holds the volume."""

from __future__ import annotations

from souk.catalog.index.base import KeyedIndex, register
from souk.models.catalog import Row, VolumeRow


@register
class VolumeIndex(KeyedIndex[VolumeRow]):
    table = "volumes"
    model = VolumeRow

    def ownership_error(self, owner: str, region: str, key: str, row: Row) -> str | None:
        assert isinstance(row, VolumeRow)
        if row.worker_id != owner or row.id != key:
            return f"volume row {row.id!r} on {row.worker_id!r} published by {owner!r}"
        return None

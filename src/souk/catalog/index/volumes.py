"""Volume rows, by id; each written by the worker that holds the volume."""

from __future__ import annotations

from souk.catalog.index.base import TableIndex, register
from souk.models.catalog import Row, VolumeRow


@register
class VolumeIndex(TableIndex):
    table = "volumes"

    def __init__(self) -> None:
        self.rows: dict[str, VolumeRow] = {}

    def put(self, owner: str, key: str, row: Row | None) -> None:
        if isinstance(row, VolumeRow):
            self.rows[key] = row
        else:
            self.rows.pop(key, None)

    def get(self, owner: str, key: str) -> Row | None:
        return self.rows.get(key)

    def ownership_error(self, owner: str, region: str, key: str, row: Row) -> str | None:
        assert isinstance(row, VolumeRow)
        if row.worker_id != owner or row.id != key:
            return f"volume row {row.id!r} on {row.worker_id!r} published by {owner!r}"
        return None

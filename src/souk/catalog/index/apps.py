"""App rows, by name: the app registry's alone to write."""

from __future__ import annotations

from souk.catalog.index.base import TableIndex, register
from souk.catalog.protocol import REGISTRY_OWNER
from souk.models.catalog import AppRow, Row


@register
class AppIndex(TableIndex):
    table = "apps"

    def __init__(self) -> None:
        self.rows: dict[str, AppRow] = {}

    def put(self, owner: str, key: str, row: Row | None) -> None:
        if isinstance(row, AppRow):
            self.rows[key] = row
        else:
            self.rows.pop(key, None)

    def get(self, owner: str, key: str) -> Row | None:
        return self.rows.get(key)

    def ownership_error(self, owner: str, region: str, key: str, row: Row) -> str | None:
        assert isinstance(row, AppRow)
        if owner != REGISTRY_OWNER or row.name != key:
            return f"app row {row.name!r} published by {owner!r}, not the app registry"
        return None

"""App rows, by name: the app registry's alone to write."""

from __future__ import annotations

from souk.catalog.index.base import KeyedIndex, register
from souk.catalog.protocol import REGISTRY_OWNER
from souk.models.catalog import AppRow, Row


@register
class AppIndex(KeyedIndex[AppRow]):
    table = "apps"
    model = AppRow

    def ownership_error(self, owner: str, region: str, key: str, row: Row) -> str | None:
        assert isinstance(row, AppRow)
        if owner != REGISTRY_OWNER or row.name != key:
            return f"app row {row.name!r} published by {owner!r}, not the app registry"
        return None

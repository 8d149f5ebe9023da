"""Revoked token ids: the app registry's alone to write; every broker refuses the token."""

from __future__ import annotations

from souk.catalog.index.base import TableIndex, register
from souk.catalog.protocol import REGISTRY_OWNER
from souk.models.catalog import RevocationRow, Row


@register
class RevocationIndex(TableIndex):
    table = "revocations"

    def __init__(self) -> None:
        self.rows: dict[str, RevocationRow] = {}

    def put(self, owner: str, key: str, row: Row | None) -> None:
        if isinstance(row, RevocationRow):
            self.rows[key] = row
        else:
            self.rows.pop(key, None)

    def get(self, owner: str, key: str) -> Row | None:
        return self.rows.get(key)

    def ownership_error(self, owner: str, region: str, key: str, row: Row) -> str | None:
        assert isinstance(row, RevocationRow)
        if owner != REGISTRY_OWNER or row.id != key:
            return f"revocation {row.id!r} published by {owner!r}, not the app registry"
        return None

"""Revoked token ids: the app registry's alone to write; every broker refuses the token."""

from __future__ import annotations

from souk.catalog.index.base import KeyedIndex, register
from souk.catalog.protocol import REGISTRY_OWNER
from souk.models.catalog import RevocationRow, Row


@register
class RevocationIndex(KeyedIndex[RevocationRow]):
    table = "revocations"
    model = RevocationRow

    def ownership_error(self, owner: str, region: str, key: str, row: Row) -> str | None:
        assert isinstance(row, RevocationRow)
        if owner != REGISTRY_OWNER or row.id != key:
            return f"revocation {row.id!r} published by {owner!r}, not the app registry"
        return None

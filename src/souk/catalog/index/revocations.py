"""Revoked token ids: the app registry's alone to write; every broker refuses the token."""

from __future__ import annotations

from souk.catalog.index.base import KeyedIndex, register
from souk.models.catalog import RevocationRow


@register
class RevocationIndex(KeyedIndex[RevocationRow]):
    table = "revocations"
    model = RevocationRow
    writer_field = None

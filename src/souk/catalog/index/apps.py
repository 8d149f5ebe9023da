"""App rows, by name: the app registry's alone to write."""

from __future__ import annotations

from souk.catalog.index.base import KeyedIndex, register
from souk.models.catalog import AppRow


@register
class AppIndex(KeyedIndex[AppRow]):
    table = "apps"
    model = AppRow
    key_field = "name"
    writer_field = None

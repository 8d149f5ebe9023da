"""Machine rows: by id, and the ids of each app's."""

from __future__ import annotations

from collections import defaultdict

from souk.catalog.index.base import TableIndex, register
from souk.models.catalog import MachineRow, Row


@register
class MachineIndex(TableIndex):
    table = "machines"

    def __init__(self) -> None:
        self.rows: dict[str, MachineRow] = {}
        self.by_app: dict[str, set[str]] = defaultdict(set)

    def put(self, owner: str, key: str, row: Row | None) -> None:
        old = self.rows.pop(key, None)
        if old is not None:
            self.by_app[old.app].discard(key)
        if isinstance(row, MachineRow):
            self.rows[key] = row
            self.by_app[row.app].add(key)

    def get(self, owner: str, key: str) -> Row | None:
        return self.rows.get(key)

"""A replica's rows in memory: one index per replicated table, each in a module of this package,
made for every table of `souk.models.catalog.ROW_MODELS` (checked when this package is imported:
a table without an index, or an index of no table, is an error at start, never a row silently
dropped). Adding a replicated table is its model in `ROW_MODELS` and its index here."""

from __future__ import annotations

import importlib
import pkgutil
from typing import TypeVar

from souk.catalog.index.base import REGISTERED, TableIndex, register
from souk.models.catalog import ROW_MODELS, Row

__all__ = ["Indexes", "TableIndex", "register"]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
if set(REGISTERED) != set(ROW_MODELS):
    raise ImportError(
        f"catalog indexes {sorted(REGISTERED)} do not match the replicated tables"
        f" {sorted(ROW_MODELS)}"
    )

_I = TypeVar("_I", bound=TableIndex)


class Indexes:
    """Every table's index, and the version held of every key (deleted ones too) as a plain
    number: the rows themselves are held once each, in their table's index (fewer objects for
    the collector to walk)."""

    def __init__(self) -> None:
        self.tables: dict[str, TableIndex] = {t: REGISTERED[t]() for t in ROW_MODELS}
        self.versions: dict[tuple[str, str, str], int] = {}  # (owner, table, key) -> seq

    def of(self, kind: type[_I]) -> _I:
        index = self.tables[kind.table]
        assert isinstance(index, kind)
        return index

    def put(self, owner: str, table: str, key: str, seq: int | None, row: Row | None) -> None:
        """Holds `row` (None: deleted) at version `seq` (None: forgotten, with its owner's
        epoch)."""
        if seq is None:
            self.versions.pop((owner, table, key), None)
        else:
            self.versions[(owner, table, key)] = seq
        self.tables[table].put(owner, key, row)

    def row(self, owner: str, table: str, key: str) -> Row | None:
        """The row of `owner` held under `key` in `table`, None if none is (or it was deleted)."""
        if (owner, table, key) not in self.versions:
            return None
        return self.tables[table].get(owner, key)

    def keys_of(self, owner: str) -> list[tuple[str, str]]:
        """(table, key) of every version held of `owner`'s, deleted ones too."""
        return [(t, k) for o, t, k in self.versions if o == owner]

    def validate(self, owner: str, region: str, table: str, key: str, row: Row) -> str | None:
        return self.tables[table].ownership_error(owner, region, key, row)

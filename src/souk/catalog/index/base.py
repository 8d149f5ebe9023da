"""What every table's index is: rows held in memory once each, by key, for the queries of the
view; and the rule of which owner may write which of its rows."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Generic, TypeVar

from souk.models.catalog import Row


class TableIndex(ABC):
    """One replicated table's rows as a replica holds them. Subclasses name their `table` (a key
    of `souk.models.catalog.ROW_MODELS`, whose model validates its rows) and `register`."""

    table: ClassVar[str]

    @abstractmethod
    def put(self, owner: str, key: str, row: Row | None) -> None:
        """Holds `row` as `owner`'s under `key` (None: deleted, or forgotten with its epoch)."""

    @abstractmethod
    def get(self, owner: str, key: str) -> Row | None: ...

    @abstractmethod
    def ownership_error(self, owner: str, region: str, key: str, row: Row) -> str | None:
        """Why `owner`, publishing in `region`, may not write `row` under `key`; None if it
        may. An owner writes only its own rows, and a row's key is its identity."""


R = TypeVar("R", bound=Row)


class KeyedIndex(TableIndex, Generic[R]):
    """A table whose rows are held by their key alone, whoever owns them (apps, revocations,
    volumes): subclasses name the `model` they hold and their ownership rule."""

    model: ClassVar[type[Row]]

    def __init__(self) -> None:
        self.rows: dict[str, R] = {}

    def put(self, owner: str, key: str, row: Row | None) -> None:
        if isinstance(row, self.model):
            self.rows[key] = row  # type: ignore[assignment]  # R is `model`
        else:
            self.rows.pop(key, None)

    def get(self, owner: str, key: str) -> Row | None:
        return self.rows.get(key)


_Index = TypeVar("_Index", bound=type[TableIndex])
REGISTERED: dict[str, type[TableIndex]] = {}


def register(cls: _Index) -> _Index:
    if cls.table in REGISTERED:
        raise TypeError(f"two indexes of table {cls.table!r}")
    REGISTERED[cls.table] = cls
    return cls

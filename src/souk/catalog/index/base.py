"""What every table's index is: rows held in memory once each, by key, for the queries of the
view; and the rule of which owner may write which of its rows."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Generic, TypeVar

from souk.catalog.protocol import REGISTRY_OWNER
from souk.models.catalog import ROW_MODELS, Row


class TableIndex(ABC):
    """One replicated table's rows as a replica holds them. Subclasses name their `table` (a key
    of `souk.models.catalog.ROW_MODELS`, whose model validates its rows), which of the row's
    fields is its key (`key_field`) and which names its one writer (`writer_field`; None: the
    app registry), and `register`."""

    table: ClassVar[str]
    key_field: ClassVar[str] = "id"
    writer_field: ClassVar[str | None] = "worker_id"

    @abstractmethod
    def put(self, owner: str, key: str, row: Row | None) -> None:
        """Holds `row` as `owner`'s under `key` (None: deleted, or forgotten with its epoch)."""

    @abstractmethod
    def get(self, owner: str, key: str) -> Row | None: ...

    def ownership_error(self, owner: str, region: str, key: str, row: Row) -> str | None:
        """Why `owner`, publishing in `region`, may not write `row` under `key`; None if it
        may. An owner writes only its own rows, and a row's key is its identity."""
        ident = getattr(row, self.key_field)
        writer = REGISTRY_OWNER if self.writer_field is None else getattr(row, self.writer_field)
        if owner != writer or ident != key:
            return f"{self.table} row {ident!r} of {writer!r} published by {owner!r} as {key!r}"
        return None


R = TypeVar("R", bound=Row)


class KeyedIndex(TableIndex, Generic[R]):
    """A table whose rows are held by their key alone, whoever owns them (apps, revocations,
    volumes): subclasses name the `model` they hold and the fields of their ownership rule."""

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
    fields = ROW_MODELS[cls.table].model_fields
    for name in (cls.key_field, cls.writer_field):
        if name is not None and name not in fields:
            raise TypeError(f"the rows of {cls.table!r} have no field {name!r}")
    REGISTERED[cls.table] = cls
    return cls

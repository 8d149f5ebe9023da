"""Worker rows: by id, by region, and each region's placeable rows as placement reads them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from souk.catalog.index.base import TableIndex, register
from souk.models.catalog import Row, WorkerRow


@dataclass
class Placeable:
    """A region's workers as placement reads them, built once and then changed row by row as
    their owners change them, fall silent or speak again: `rows` the reachable ones (what
    `Replica.placeable` hands out), `left_out` the ids of the others (`Replica.silent`). Reading
    a region of 10,000 workers afresh for every create cost more than the rest of the decision,
    and so did rebuilding it whenever an owner might have fallen silent (see docs/benchmarks.md,
    "Placement at 10,000 workers, end to end")."""

    rows: list[WorkerRow]
    pos: dict[str, int]
    left_out: set[str]

    def put(self, row: WorkerRow, reachable: bool) -> None:
        """A row changed or arrived: replaced in place if held, else added where it belongs."""
        at = self.pos.get(row.id)
        if at is not None:
            self.rows[at] = row
        elif reachable:
            self.reach(row)
        else:
            self.left_out.add(row.id)

    def reach(self, row: WorkerRow) -> None:
        if row.id not in self.pos:
            self.pos[row.id] = len(self.rows)
            self.rows.append(row)
        self.left_out.discard(row.id)

    def leave_out(self, key: str) -> None:
        self.drop(key)
        self.left_out.add(key)

    def drop(self, key: str) -> None:
        self.left_out.discard(key)
        at = self.pos.pop(key, None)
        if at is None:
            return
        last = self.rows.pop()
        if at < len(self.rows):  # the last row takes the removed one's place
            self.rows[at] = last
            self.pos[last.id] = at


@register
class WorkerIndex(TableIndex):
    table = "workers"
    writer_field = "id"

    def __init__(self) -> None:
        self.rows: dict[str, WorkerRow] = {}
        self.in_region: dict[str, dict[str, WorkerRow]] = defaultdict(dict)
        self.placeable: dict[str, Placeable] = {}  # built per region at its first read
        self.reachable: Callable[[str], bool] = lambda owner: True  # set by the replica

    def put(self, owner: str, key: str, row: Row | None) -> None:
        was = self.rows.pop(key, None)
        new = row if isinstance(row, WorkerRow) else None
        if was is not None:
            self.in_region[was.region].pop(key, None)
            if new is None or new.region != was.region:
                self._unplace(was.region, key)
        if new is not None:
            self.rows[key] = new
            self.in_region[new.region][key] = new
            self.place(key)

    def get(self, owner: str, key: str) -> Row | None:
        return self.rows.get(key)

    def ownership_error(self, owner: str, region: str, key: str, row: Row) -> str | None:
        """A worker's row is its own, and in the region it publishes in."""
        assert isinstance(row, WorkerRow)
        if row.region != region:
            return f"worker row {row.id!r} of region {row.region!r} published in {region!r}"
        return super().ownership_error(owner, region, key, row)

    def held(self, region: str) -> Placeable:
        """The region's `Placeable`, made from its rows at the first read (once per region)."""
        held = self.placeable.get(region)
        if held is None:
            held = self.placeable[region] = Placeable([], {}, set())
            for w in self.in_region.get(region, {}).values():
                held.put(w, self.reachable(w.id))
        return held

    def place(self, key: str) -> None:
        """A worker row changed, or its owner speaks again: in place in its region's
        `Placeable`, or added to it (left out while its owner is unreachable)."""
        row = self.rows.get(key)
        held = None if row is None else self.placeable.get(row.region)
        if row is not None and held is not None:
            held.put(row, self.reachable(key))

    def leave_out(self, key: str) -> None:
        """Its owner fell silent: out of the placeable rows, among the silent ones."""
        row = self.rows.get(key)
        held = None if row is None else self.placeable.get(row.region)
        if held is not None:
            held.leave_out(key)

    def _unplace(self, region: str, key: str) -> None:
        held = self.placeable.get(region)
        if held is not None:
            held.drop(key)

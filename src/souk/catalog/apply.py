"""Applying rows: what is newer than held, validated, into the indexes, the SQLite copy and the
change stream, with the owner's head moved in the same transaction.

Rules that make a replica converge whatever the bus does (drop, duplicate, reorder):
- a row version is applied only if its owner sequence is newer than the one held, so duplicates
  and stale copies are no-ops and deletions leave a versioned tombstone;
- an owner's head only advances over contiguous history (the sync part decides which);
- a newer epoch (the owner's database was recreated) replaces all of that owner's rows; an
  older one is a late message from before, and is dropped.
Rows are validated with the shared models before they are applied; a row that fails is
quarantined and reported, and the rest of its batch still applies.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable

from pydantic import ValidationError

from souk.catalog.index import Indexes
from souk.catalog.owners import Liveness, OwnerState
from souk.catalog.protocol import GLOBAL_REGION, Change
from souk.catalog.signing import Signed
from souk.catalog.store import ReplicaStore
from souk.catalog.stream import ChangeStream
from souk.logsetup import about
from souk.models.catalog import ROW_MODELS, Row, RowChange

log = logging.getLogger("souk.catalog.replica")


class Applier:
    def __init__(
        self,
        store: ReplicaStore,
        indexes: Indexes,
        owners: dict[str, OwnerState],
        stream: ChangeStream,
        liveness: Liveness,
        regions: set[str] | None,
    ) -> None:
        self.store = store
        self.liveness = liveness
        self.indexes = indexes
        self.owners = owners
        self.stream = stream
        self.regions = regions
        self.bootstrapping = False  # loading a snapshot: no gap is pulled, no snapshot served
        self.stats: dict[str, int] = defaultdict(int)
        self.on_apply: Callable[[float], None] | None = None  # told each apply's seconds

    def load(self) -> None:
        """The rows and heads of the SQLite copy, into memory (a replica started again)."""
        for owner, region, epoch, head in self.store.owners():
            self.owners[owner] = OwnerState(region, epoch, head, head)
        for owner, table, key, seq, row in self.store.all_rows():
            model = None if row is None else ROW_MODELS[table].model_validate(row)
            self.indexes.put(owner, table, key, seq, model)

    def follows(self, region: str) -> bool:
        return self.regions is None or region in self.regions or region == GLOBAL_REGION

    def owner(self, owner: str, region: str, epoch: str) -> OwnerState | None:
        """The owner's state for a message of this epoch, or None if the message is stale."""
        st = self.owners.get(owner)
        if st is None:
            st = self.owners[owner] = OwnerState(region, epoch)
            self.store.save_owner(owner, region, epoch, 0)
            return st
        if st.epoch == epoch:
            return st
        if epoch < st.epoch:  # epochs sort by the time the owner's database was created
            self.stats["stale_epoch"] += 1
            return None
        log.info("owner %s has a new epoch %s (was %s): replacing its rows", owner, epoch, st.epoch)
        self.stats["new_epoch"] += 1
        for table, key in self.indexes.keys_of(owner):
            self.indexes.put(owner, table, key, None, None)
        self.store.drop_owner(owner)
        new = OwnerState(region, epoch)  # its head proof goes with the rows
        new.heard, new.heard_wall, new.apps = st.heard, st.heard_wall, st.apps
        self.owners[owner] = new
        self.store.save_owner(owner, region, epoch, 0)
        return new

    def take(
        self,
        owner: str,
        st: OwnerState,
        region: str,
        head: int,
        changes: list[Change],
        signed: Signed | None,
        contiguous: bool,
        replace: bool = False,
    ) -> None:
        """Applies a batch or pull reply that reaches `head`, moving the owner's head there if
        it follows on from what is held (`contiguous`)."""
        if signed is None or head > st.head:
            self.liveness.heard(owner, st, head)  # signed: an old one replayed is no sign of life
        proof = None if signed is None else signed.head_proof()
        advance = (st, head, proof) if contiguous else None
        self.apply(owner, region, changes, advance, signed, replace=replace)

    def apply(
        self,
        owner: str,
        region: str,
        changes: list[Change],
        advance: tuple[OwnerState, int, str | None] | None = None,
        signed: Signed | None = None,
        proofs: list[tuple[bytes, str]] | None = None,
        replace: bool = False,
    ) -> int:
        """Applies what is newer than held, and moves the owner's head to `advance` (state,
        head, the owner's proof of it) in the same transaction (committed at the stream's
        flush); returns how many rows changed. Each row is stored with its owner's proof: from
        the message it came in (`signed`), or as relayed (`proofs`: (row text, proof) per
        change). `replace`: every change replaces what is held, older or not (the owner's own word,
        after rows applied unchecked failed an audit)."""
        applied, began = 0, time.perf_counter()
        fresh = self.stream.unflushed
        versions = self.indexes.versions
        self.store.begin()
        try:
            for i, change in enumerate(changes):
                held = versions.get((owner, change.table, change.key))
                if held is not None and held >= change.seq and not replace:
                    self.stats["stale_rows"] += 1
                    continue
                model = self._validate(owner, region, change)
                if model is False:
                    continue
                row = model if isinstance(model, Row) else None
                self.indexes.put(owner, change.table, change.key, change.seq, row)
                text = proof = None
                if signed is not None:
                    text, proof = signed.texts[i], signed.row_proof(i)
                elif proofs is not None:
                    text, proof = proofs[i]
                lseq = self.store.put(
                    owner, change.table, change.key, change.seq, change.row, text, proof
                )
                fresh.append(
                    RowChange(
                        lseq=lseq,
                        table=change.table,
                        key=change.key,
                        owner=owner,
                        seq=change.seq,
                        row=change.row,
                    )
                )
                applied += 1
            if advance is not None:
                self.advance(owner, *advance)
        finally:
            self.stream.flush_soon()
        self.stats["applied"] += applied
        if self.on_apply is not None:
            self.on_apply(time.perf_counter() - began)
        return applied

    def advance(self, owner: str, st: OwnerState, head: int, proof: str | None) -> None:
        if head > st.head:
            st.head = head
            self.store.save_owner(owner, st.region, st.epoch, head, proof)

    def _validate(self, owner: str, region: str, change: Change) -> Row | bool | None:
        """The row as a model, None for a deletion, False if it was quarantined."""
        model_type = ROW_MODELS.get(change.table)
        error = None
        model: Row | None = None
        if model_type is None:
            error = f"unknown table {change.table!r}"
        elif change.row is not None:
            try:
                model = model_type.model_validate(change.row)
            except ValidationError as exc:
                error = f"invalid row: {exc.errors(include_url=False)}"[:2000]
            else:
                error = self.indexes.validate(owner, region, change.table, change.key, model)
        if error is None:
            return model
        if self.store.quarantine(owner, change.table, change.key, change.seq, change.row, error):
            self.stats["quarantined"] += 1
            log.warning(
                "quarantined %s/%s from %s: %s",
                change.table,
                change.key,
                owner,
                error,
                extra=about(change.key, "quarantined", kind=change.table, owner=owner),
            )
        return False

"""The change stream: every change a replica applies, told to subscribers once it is committed,
and replayed from the replica's own log to a subscriber that resumes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from souk.catalog.store import ReplicaStore
from souk.models.catalog import RowChange


class ResyncNeeded(Exception):
    """The subscriber's position is older than the replica's change log: read rows afresh."""

    def __init__(self, oldest: int) -> None:
        super().__init__(f"changes before {oldest} are no longer kept; read the rows afresh")
        self.oldest = oldest


class ChangeStream:
    def __init__(self, store: ReplicaStore) -> None:
        self.store = store
        self._listeners: list[asyncio.Queue[RowChange]] = []
        self.unflushed: list[RowChange] = []  # applied, to commit and announce at `flush`
        self._flush_at: asyncio.Handle | None = None

    def flush_soon(self) -> None:
        if self._flush_at is not None:
            return
        try:
            self._flush_at = asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no loop: nothing else can join the transaction
            self.flush()

    def flush(self) -> None:
        """Commits every batch applied in this turn of the event loop at once (a commit was the
        largest part of a batch's cost), then tells subscribers: they only ever hear of a change
        that is committed, so one they resume from is never lost."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        self.store.commit()
        fresh, self.unflushed = self.unflushed, []
        for rc in fresh:
            for queue in self._listeners:
                queue.put_nowait(rc)

    async def subscribe(
        self, tables: frozenset[str] | None = None, since: int | None = None
    ) -> AsyncGenerator[RowChange, None]:
        """Changes as they are applied. With `since`, first replays what this replica applied
        after it (from its log); `ResyncNeeded` if that part of the log is gone."""
        queue: asyncio.Queue[RowChange] = asyncio.Queue()
        self._listeners.append(queue)
        try:
            last = self.store.last_change() if since is None else since
            if since is not None:
                oldest = self.store.oldest_change()
                if oldest and since < oldest - 1:
                    raise ResyncNeeded(oldest)
                while True:
                    page = self.store.changes_after(last)
                    if not page:
                        break
                    for lseq, owner, table, key, seq, row in page:
                        last = lseq
                        if tables is None or table in tables:
                            yield RowChange(
                                lseq=lseq, table=table, key=key, owner=owner, seq=seq, row=row
                            )
            while True:
                rc = await queue.get()
                if rc.lseq <= last:
                    continue
                last = rc.lseq
                if tables is None or rc.table in tables:
                    yield rc
        finally:
            self._listeners.remove(queue)

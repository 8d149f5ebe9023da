"""The worker's rows for the catalog: its worker row, its machines and its cached images, versioned
by its operation-log sequence.

The operation log is the change feed: a row's version is the seq of the last step that touched
it, and an evicted image's deletion is the seq of its eviction step, so a replica that asks for
"everything after N" gets deletions too.
"""

from __future__ import annotations

from typing import Any

from souk.catalog.owner import Owner
from souk.catalog.protocol import Change
from souk.models.catalog import ImageRow, MeshPeer, VolumeRow, machine_row, worker_row
from souk.worker.engine import Engine
from souk.worker.state import queries, volume_queries
from souk.worker.state.store import Commit


class WorkerRows:
    """A `RowSource` over the worker's database; `on_commit` feeds an `Owner` as commits land."""

    def __init__(self, engine: Engine, address: str) -> None:
        self.engine = engine
        self.store = engine.store
        self.owner = engine.settings.name
        self.region = engine.settings.region
        self.epoch = engine.epoch
        self.address = address
        self.publisher: Owner | None = None
        self.mesh: MeshPeer | None = None  # this node on the mesh (docs/network.md)

    def attach(self, publisher: Owner) -> None:
        self.publisher = publisher
        self.store.listeners.append(self.on_commit)

    def detach(self) -> None:
        if self.on_commit in self.store.listeners:
            self.store.listeners.remove(self.on_commit)
        self.publisher = None

    def head(self) -> int:
        return self.store.head()

    def _worker(self) -> dict[str, Any]:
        row = worker_row(self.engine.capacity(), self.address, self.epoch)
        row.mesh = self.mesh
        left_out = {"unreachable", "last_heartbeat"} | ({"mesh"} if self.mesh is None else set())
        return row.model_dump(mode="json", exclude=left_out)

    def _machine(self, machine_id: str) -> Change:
        """The machine's row and its version, read together."""
        row = queries.existing_machine(self.store.read, machine_id)
        machine = machine_row(self.engine.machine_from_row(row))
        return Change("machines", machine_id, row["seq"], machine.model_dump(mode="json"))

    def _image(self, digest: str) -> dict[str, Any] | None:
        row = queries.image(self.store.read, digest)
        if row is None:
            return None
        image = ImageRow(worker_id=self.owner, digest=digest, ref=row["ref"], size=row["size"])
        return image.model_dump(mode="json")

    def _volume(self, volume_id: str) -> Change:
        """The volume's row and its version; a destroyed one's deletion."""
        row = volume_queries.volume(self.store.read, volume_id)
        if row is None:
            return Change("volumes", volume_id, self.head(), None)
        if row["state"] == "destroyed":
            return Change("volumes", volume_id, row["seq"], None)
        volume = VolumeRow(
            id=volume_id,
            app=row["app"],
            name=row["name"],
            region=self.region,
            worker_id=self.owner,
            state=row["state"],
            size_mb=row["size_mb"],
            attached_machine_id=row["attached_machine"],
            created_at=row["created_at"],
        )
        return Change("volumes", volume_id, row["seq"], volume.model_dump(mode="json"))

    def on_commit(self, commit: Commit) -> None:
        """Runs on the event loop, in commit order: the rows this commit touched, as they are now
        (a later commit's effects may show, with that commit's seq: versions only move on), and
        the worker's own row; the `Owner` sends only those that changed."""
        if self.publisher is None:
            return
        changes = []
        for kind, resource in sorted(commit.touched):
            if kind == "machine":
                changes.append(self._machine(resource))
            elif kind == "image":
                changes.append(Change("images", resource, commit.last_seq, self._image(resource)))
            elif kind == "volume":
                changes.append(self._volume(resource))
        changes.append(Change("workers", self.owner, commit.last_seq, self._worker()))
        self.publisher.committed(commit.last_seq, changes)

    def changes_since(self, since: int, limit: int) -> tuple[list[Change], int, bool]:
        read = self.store.read
        head = self.head()
        # A fresh replica (since 0) needs no tombstones: destroyed volumes stay home. A destroyed
        # machine is a row every replica shows, as a snapshot relays it: sent, or a replica that
        # pulled from 0 relays snapshots without it, under heads that say it is there.
        live_only = since == 0
        found: list[tuple[int, str, str]] = [
            (seq, "machines", mid)
            for seq, mid in queries.machines_changed_since(read, since, limit + 1)
        ]
        found += [
            (seq, "images", digest) for seq, digest in queries.images_changed_since(read, since)
        ]
        found += [
            (seq, "volumes", vid)
            for seq, vid in volume_queries.volumes_changed_since(read, since, limit + 1, live_only)
        ]
        # A deferred commit (store.py) is not durable yet: its rows come with the commit that is.
        found = sorted(f for f in found if f[0] <= head)
        more = len(found) > limit
        if more:
            found = found[:limit]
            head = found[-1][0]
        changes = []
        for seq, table, key in found:
            if table == "machines":
                changes.append(self._machine(key))
            elif table == "volumes":
                changes.append(self._volume(key))
            else:
                changes.append(Change(table, key, seq, self._image(key)))
        changes.append(Change("workers", self.owner, head, self._worker()))
        return changes, head, more

    def apps(self) -> list[str]:
        return queries.apps(self.store.read)

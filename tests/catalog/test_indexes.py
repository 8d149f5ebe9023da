"""The replica's indexes: one per replicated table, made from the models' table list; what
each lets an owner write; and the lookups placement reads without scanning a region (each
region's placeable rows, kept between reads yet following every change; an image's holders)."""

from __future__ import annotations

from typing import Any

import pytest

from souk.catalog.bus import InProcessBus
from souk.catalog.index import Indexes
from souk.catalog.index.base import REGISTERED, TableIndex, register
from souk.catalog.index.volumes import VolumeIndex
from souk.catalog.index.workers import WorkerIndex
from souk.catalog.protocol import REGISTRY_OWNER
from souk.catalog.replica import Replica
from souk.catalog.sim import SimRows
from souk.models.catalog import ROW_MODELS, Row
from tests.support.catalog import converged, start_owner
from tests.support.waiting import eventually


def test_every_replicated_table_has_its_one_index() -> None:
    indexes = Indexes()
    assert set(indexes.tables) == set(ROW_MODELS) == set(REGISTERED)
    assert all(i.table == table for table, i in indexes.tables.items())

    class Twice(TableIndex):
        table = "machines"

        def put(self, owner: str, key: str, row: Row | None) -> None: ...

        def get(self, owner: str, key: str) -> Row | None: ...

    with pytest.raises(TypeError, match="two indexes"):
        register(Twice)
    assert REGISTERED["machines"] is not Twice


# table -> (its key field, its writer field: None for the app registry's tables)
OWNERSHIP = {
    "workers": ("id", "id"),
    "machines": ("id", "worker_id"),
    "images": ("digest", "worker_id"),
    "volumes": ("id", "worker_id"),
    "apps": ("name", None),
    "revocations": ("id", None),
}


@pytest.mark.parametrize("table", sorted(OWNERSHIP))
def test_an_owner_writes_its_own_rows_under_their_own_key(table: str) -> None:
    key_field, writer_field = OWNERSHIP[table]
    index, model = Indexes().tables[table], ROW_MODELS[table]
    writer = REGISTRY_OWNER if writer_field is None else "w1"
    key = writer if key_field == writer_field else "k1"  # a worker's row is keyed by its name

    def row(**fields: str) -> Row:
        values: dict[str, Any] = {"region": "mad", key_field: key, **fields}
        return model.model_construct(None, **values)

    own = row(**({} if writer_field is None else {writer_field: writer}))
    assert index.ownership_error(writer, "mad", key, own) is None
    assert index.ownership_error(writer, "mad", "k2", own)  # its key is its identity
    assert index.ownership_error("w2", "mad", key, own)  # another owner may not write it
    if writer_field is not None and writer_field != key_field:
        assert index.ownership_error("w2", "mad", key, row(**{writer_field: "w2"})) is None
    if table == "workers":
        assert index.ownership_error(writer, "ams", key, own)  # nor from another region


def test_an_index_names_fields_its_rows_have() -> None:
    class Misnamed(TableIndex):
        table = "volumes"
        writer_field = "owner"

        def put(self, owner: str, key: str, row: Row | None) -> None: ...

        def get(self, owner: str, key: str) -> Row | None: ...

    REGISTERED.pop("volumes")
    try:
        with pytest.raises(TypeError, match="no field 'owner'"):
            register(Misnamed)
    finally:
        REGISTERED["volumes"] = VolumeIndex


async def test_a_volume_row_naming_another_worker_is_quarantined() -> None:
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    volume = {
        "id": "vol_1",
        "app": "web",
        "name": "data",
        "region": "mad",
        "worker_id": "w1",
        "state": "created",
        "size_mb": 1024,
        "created_at": "2026-01-01T00:00:00Z",
    }
    src.put("volumes", "vol_1", volume)
    forged = src.put("volumes", "vol_2", {**volume, "id": "vol_2", "worker_id": "w2"})
    owner = await start_owner(bus, src)
    await eventually(lambda: replica.head("w1") == src.seq)
    assert [v.id for v in replica.volumes()] == ["vol_1"]
    quarantined = {(q["key"], q["seq"]) for q in replica.status()["quarantined"]}
    assert quarantined == {("vol_2", forged.seq)}
    await owner.stop()
    await replica.stop()


async def test_placeable_rows_follow_changes_arrivals_and_silence() -> None:
    bus = InProcessBus()
    replica = Replica(bus, unreachable_after=0.4)
    await replica.start(bootstrap=False)
    sources = [SimRows(f"w{i}", "mad") for i in range(3)]
    owners = [await start_owner(bus, s, beat=0.1) for s in sources]
    await eventually(lambda: converged(replica, sources))
    first = replica.placeable("mad")
    assert {w.id for w in first} == {"w0", "w1", "w2"}
    assert replica.placeable("mad") is first  # kept, not rebuilt, between reads

    sources[1].put("workers", "w1", sources[1].worker_row(5).model_dump(mode="json"))
    await eventually(lambda: converged(replica, sources))
    (w1,) = [w for w in replica.placeable("mad") if w.id == "w1"]
    held = replica.indexes.of(WorkerIndex).rows["w1"]
    assert w1.cpus_reserved == 5 and w1 is held  # the row as now held

    late = SimRows("w3", "mad")
    owners.append(await start_owner(bus, late, beat=0.1))
    await eventually(lambda: "w3" in {w.id for w in replica.placeable("mad")})

    sources[0].put("workers", "w0", None)  # the worker row deleted
    await eventually(lambda: "w0" not in {w.id for w in replica.placeable("mad")})

    await owners[2].stop()  # w2 falls silent
    await eventually(lambda: {w.id for w in replica.placeable("mad")} == {"w1", "w3"})
    assert [w.id for w in replica.silent("mad")] == ["w2"]
    assert replica.silent("mad")[0].unreachable
    assert replica.worker_regions() == ["mad"]  # a silent worker's region still counts
    assert len(replica.placeable("mad")) == len({w.id for w in replica.placeable("mad")})

    owners[2] = await start_owner(bus, sources[2], beat=0.1)  # w2 speaks again
    await eventually(lambda: "w2" in {w.id for w in replica.placeable("mad")})
    assert replica.silent("mad") == []
    # never rebuilt: silence and return changed the held list row by row
    assert replica.placeable("mad") is first
    assert sorted(w.id for w in first) == ["w1", "w2", "w3"]
    for o in owners:
        await o.stop()
    await replica.stop()


async def test_the_replica_finds_the_workers_holding_an_image_by_digest_or_reference() -> None:
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    w1, w2, w3 = SimRows("w1", "mad"), SimRows("w2", "mad"), SimRows("w3", "ams")
    owners = [await start_owner(bus, src) for src in (w1, w2, w3)]
    ref, first, second = "registry.example/app:1", "sha256:" + "1" * 64, "sha256:" + "2" * 64

    def image(src: SimRows, digest: str, present: bool = True) -> None:
        row = {"worker_id": src.owner, "digest": digest, "ref": ref, "size": 1}
        src.put("images", digest, row if present else None)

    def holding(region: str, name: str) -> list[str]:
        rows = replica.placeable_holding(region, name)
        placeable = replica.placeable(region)
        assert all(any(row is p for p in placeable) for row in rows)  # the rows placement holds
        return sorted(w.id for w in rows)

    for src in (w1, w2, w3):
        image(src, first)
    await eventually(lambda: converged(replica, [w1, w2, w3]))
    assert holding("mad", ref) == holding("mad", first) == ["w1", "w2"]
    assert holding("ams", ref) == ["w3"] and holding("mad", "other:1") == []
    image(w1, second)  # the tag moved: w1 pulled it again, then let the first digest go
    image(w1, first, present=False)
    await eventually(lambda: converged(replica, [w1]))
    assert holding("mad", ref) == ["w1", "w2"]  # w1 still holds what the tag names
    assert holding("mad", first) == ["w2"] and holding("mad", second) == ["w1"]
    image(w1, second, present=False)
    await eventually(lambda: converged(replica, [w1]))
    assert holding("mad", ref) == ["w2"] and holding("mad", second) == []
    for owner in owners:
        await owner.stop()
    await replica.stop()

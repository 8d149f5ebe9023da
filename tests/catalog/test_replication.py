"""Replication over the in-process bus: ordering, gaps, epochs, quarantine, snapshots,
subscriptions and reachability."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from souk.catalog.bus import Faults, InProcessBus
from souk.catalog.owner import BATCH_BYTES
from souk.catalog.protocol import Batch, Change, changes_subject, encode
from souk.catalog.replica import Replica
from souk.catalog.sim import SimRows
from tests.support.catalog import converged, start_owner
from tests.support.waiting import eventually


async def test_a_commit_reaches_a_replica_and_is_queryable() -> None:
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src)
    src.machine("web")
    src.machine("api", state="stopped")
    await eventually(lambda: converged(replica, [src]))
    assert [w.id for w in replica.workers(region="mad")] == ["w1"]
    assert replica.workers(region="ams") == []
    assert {m.app for m in replica.machines()} == {"web", "api"}
    assert [m.app for m in replica.machines(app="web")] == ["web"]
    await eventually(lambda: replica.regions_of_app("web") == ["mad"])
    await owner.stop()
    await replica.stop()


async def test_a_missed_batch_is_pulled() -> None:
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src, beat=60)  # no heartbeat helps here
    src.machine("web", key="m1")
    await eventually(lambda: converged(replica, [src]))
    bus.faults.down = True
    src.machine("web", key="m2")
    src.put("machines", "m1", None)
    await asyncio.sleep(0.05)
    bus.faults.down = False
    src.machine("web", key="m3")  # its batch's prev is beyond the replica's head: a gap
    await eventually(lambda: converged(replica, [src]))
    assert {m.id for m in replica.machines(app="web")} == {"m2", "m3"}
    assert replica.stats["gaps"] >= 1 and replica.stats["pulls"] >= 1
    await owner.stop()
    await replica.stop()


async def test_an_owner_sends_a_row_only_when_it_reads_differently() -> None:
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src, beat=60)
    row = src.machine("web", key="m1").row
    assert row is not None
    await eventually(lambda: converged(replica, [src]))
    sent, gaps = owner.batches, replica.stats["gaps"]
    src.put("machines", "m1", row)  # a new version that reads as the last: not sent
    await asyncio.sleep(0.05)
    assert owner.batches == sent and replica.head("w1") == src.seq - 1
    for change in ({**row, "state": "stopped"}, None, row):  # changed, deleted, back again
        src.put("machines", "m1", change)
        await eventually(lambda: replica.head("w1") == src.seq)
    assert owner.batches == sent + 3
    assert [m.state for m in replica.machines(app="web")] == ["started"]
    assert replica.stats["gaps"] == gaps  # each batch followed on from the last one sent
    await owner.stop()
    await replica.stop()


async def test_stale_and_duplicate_versions_are_ignored() -> None:
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    new = src.machine("web", key="m1", state="stopped")
    old = Change("machines", "m1", new.seq - 1, {**(new.row or {}), "state": "started"})
    stale = Batch("w1", "mad", "e1", 0, new.seq, [new, old, new])
    await bus.publish(changes_subject("mad", "w1"), encode(stale))
    await eventually(lambda: replica.machine("m1") is not None)
    machine = replica.machine("m1")
    assert machine is not None and machine.state == "stopped"
    await replica.stop()


async def test_a_new_epoch_replaces_the_owners_rows(tmp_path: Path) -> None:
    bus = InProcessBus()
    replica = Replica(bus, tmp_path / "r.db")
    await replica.start(bootstrap=False)
    first = SimRows("w1", "mad", epoch="e1")
    owner = await start_owner(bus, first)
    first.machine("web", key="old")
    await eventually(lambda: converged(replica, [first]))
    await owner.stop()
    second = SimRows("w1", "mad", epoch="e2")  # the worker's database was recreated
    owner = await start_owner(bus, second)
    second.machine("web", key="new")
    await eventually(lambda: converged(replica, [second]))
    assert replica.machine("old") is None
    # a late message of the retired epoch changes nothing
    late = Batch(
        "w1",
        "mad",
        "e1",
        0,
        99,
        [Change("machines", "zombie", 99, first.rows[("machines", "old")].row)],
    )
    await bus.publish(changes_subject("mad", "w1"), encode(late))
    await asyncio.sleep(0.05)
    assert replica.machine("zombie") is None and replica.stats["stale_epoch"] >= 1
    await owner.stop()
    await replica.stop()


async def test_a_malformed_row_is_quarantined_and_the_rest_applies() -> None:
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    good = src.machine("web", key="good")
    bad = src.put("machines", "bad", {"id": "bad", "app": "web", "state": "exploded"})
    forged = src.put(
        "machines", "forged", {**(good.row or {}), "id": "forged", "worker_id": "someone-else"}
    )
    owner = await start_owner(bus, src)
    await eventually(lambda: replica.head("w1") == src.seq)
    assert replica.machine("good") is not None
    assert replica.machine("bad") is None and replica.machine("forged") is None
    quarantined = {(q["key"], q["seq"]) for q in replica.status()["quarantined"]}
    assert quarantined == {("bad", bad.seq), ("forged", forged.seq)}
    await owner.stop()
    await replica.stop()


async def test_a_fresh_replica_bootstraps_from_a_snapshot_then_catches_up() -> None:
    bus = InProcessBus()
    first = Replica(bus)
    await first.start(bootstrap=False)
    sources = [SimRows(f"w{i}", "mad" if i % 2 else "ams") for i in range(4)]
    owners = [await start_owner(bus, s, beat=60) for s in sources]
    for s in sources:
        for _ in range(5):
            s.machine("web")
    await eventually(lambda: converged(first, sources))
    second = Replica(bus)
    await second.start()
    assert second.stats["snapshots_loaded"] == 1 and second.stats["pulls"] == 0
    assert converged(second, sources)
    sources[0].machine("web")  # and it keeps up by sequence
    await eventually(lambda: converged(second, sources))
    # one region only: it bootstraps from a replica that has it, and ignores the other region
    third = Replica(bus, regions=["ams"])
    await third.start()
    ams = [s for s in sources if s.region == "ams"]
    assert converged(third, ams) and third.workers(region="mad") == []
    assert third.regions_of_app("web") == ["ams"]  # mad only by heartbeat, every 60 s here
    for o in owners:
        await o.heartbeat()
    await eventually(lambda: third.regions_of_app("web") == ["ams", "mad"])
    for o in owners:
        await o.stop()
    for r in (first, second, third):
        await r.stop()


async def test_a_silent_owner_is_unreachable_until_it_speaks_again() -> None:
    bus = InProcessBus()
    replica = Replica(bus, unreachable_after=0.3)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src)
    await eventually(lambda: converged(replica, [src]))
    assert [w.id for w in replica.workers()] == ["w1"]
    assert [w.id for w in replica.placeable("mad")] == ["w1"]
    assert replica.placeable("ams") == []
    bus.faults.down = True
    await eventually(lambda: replica.workers() == [])
    assert replica.placeable("mad") == []
    row = replica.worker("w1")
    assert row is not None and row.unreachable  # kept, flagged
    assert replica.workers(reachable_only=False)[0].unreachable
    bus.faults.down = False
    await eventually(lambda: [w.id for w in replica.workers()] == ["w1"])
    assert [w.id for w in replica.placeable("mad")] == ["w1"]
    await owner.stop()
    await replica.stop()


async def test_a_subscription_resumes_without_missing_a_change(tmp_path: Path) -> None:
    bus = InProcessBus()
    replica = Replica(bus, tmp_path / "r.db")
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src)
    stream = replica.subscribe(frozenset({"machines"}))
    src.machine("web", key="a")
    first = await asyncio.wait_for(anext(stream), 5)
    assert (first.table, first.key) == ("machines", "a")
    await stream.aclose()  # the subscriber goes away; changes keep coming
    src.machine("web", key="b")
    src.machine("web", key="c")
    await eventually(lambda: converged(replica, [src]))
    resumed = replica.subscribe(frozenset({"machines"}), since=first.lseq)
    keys = [(await asyncio.wait_for(anext(resumed), 5)).key for _ in range(2)]
    assert keys == ["b", "c"]
    src.machine("web", key="d")
    assert (await asyncio.wait_for(anext(resumed), 5)).key == "d"
    await resumed.aclose()
    await owner.stop()
    await replica.stop()


async def test_batches_arriving_together_share_a_commit_that_precedes_their_announcement(
    tmp_path: Path,
) -> None:
    bus = InProcessBus()
    replica = Replica(bus, tmp_path / "r.db")
    await replica.start(bootstrap=False)
    stream = replica.subscribe(frozenset({"machines"}))
    next_one = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)  # the subscription listens
    src = SimRows("w1", "mad")
    changes = [src.machine("web", key=f"m{i}") for i in range(20)]
    commits = replica.store.commits
    for change in changes:  # one turn of the event loop: the bus delivers each at once
        batch = Batch("w1", "mad", "e1", change.seq - 1, change.seq, [change])
        await bus.publish(changes_subject("mad", "w1"), encode(batch))
    other = sqlite3.connect(tmp_path / "r.db")  # what a restarted replica would read
    for change in changes:
        heard = await asyncio.wait_for(next_one, 5)
        next_one = asyncio.ensure_future(anext(stream))
        assert heard.key == change.key
        stored = other.execute("SELECT seq FROM rows WHERE key = ?", (heard.key,)).fetchone()
        assert stored == (change.seq,)
    assert replica.store.commits - commits <= 2  # not one per batch
    other.close()
    next_one.cancel()
    await replica.stop()


async def test_a_restarted_replica_keeps_its_rows_and_heads(tmp_path: Path) -> None:
    bus = InProcessBus()
    replica = Replica(bus, tmp_path / "r.db")
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src)
    src.machine("web", key="a")
    await eventually(lambda: converged(replica, [src]))
    await replica.stop()
    again = Replica(bus, tmp_path / "r.db")
    assert again.machine("a") is not None and again.head("w1") == src.seq
    await again.start()
    src.machine("web", key="b")
    await eventually(lambda: converged(again, [src]))
    assert again.stats["pulls"] == 0
    await owner.stop()
    await again.stop()


async def test_faults_on_the_bus_still_converge() -> None:
    bus = InProcessBus(Faults(drop=0.3, duplicate=0.3, reorder=0.3, seed=7))
    replica = Replica(bus, pull_timeout=0.2)
    await replica.start(bootstrap=False)
    sources = [SimRows(f"w{i}", "mad") for i in range(3)]
    owners = [await start_owner(bus, s) for s in sources]
    for n in range(30):
        s = sources[n % 3]
        s.machine("web", key=f"m{n % 7}-{s.owner}", state="started" if n % 2 else "stopped")
        await asyncio.sleep(0)
    await eventually(lambda: converged(replica, sources), timeout=20)
    for o in owners:
        await o.stop()
    await replica.stop()


async def test_a_burst_bigger_than_a_bus_message_is_split_into_batches_that_converge() -> None:
    bus = InProcessBus()
    sizes: list[int] = []
    sent = bus.publish

    async def measured(subject: str, data: bytes, reply: str | None = None) -> None:
        if subject.startswith(changes_subject("mad", "w1").rsplit(".", 1)[0]):
            sizes.append(len(data))
        await sent(subject, data, reply)

    bus.publish = measured  # type: ignore[method-assign]
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src, beat=60)
    big = "x" * 60_000  # a machine near the metadata limit
    for i in range(20):  # one publish: committed in one turn of the loop
        change = src.machine("web", key=f"m{i}")
        assert change.row is not None
        src.put("machines", f"m{i}", {**change.row, "metadata": {"blob": big}})
    await eventually(lambda: converged(replica, [src]))
    assert len(replica.machines(app="web")) == 20
    assert len(sizes) >= 4 and max(sizes) < BATCH_BYTES + 70_000
    await owner.stop()
    await replica.stop()

"""What keeps a replica cheap at scale: a heartbeat without news writes nothing, the rows it
churns leave the garbage collector little to walk, and the placeable rows placement reads are
kept between reads yet follow every change."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from souk.catalog.bus import InProcessBus
from souk.catalog.replica import Replica
from souk.catalog.sim import SimRows
from tests.support.catalog import converged, start_owner
from tests.support.waiting import eventually


async def test_a_heartbeat_without_news_writes_nothing_but_keeps_the_owner_alive(
    tmp_path: Path,
) -> None:
    bus = InProcessBus()
    replica = Replica(bus, tmp_path / "r.db", unreachable_after=0.5)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src, beat=60)
    src.machine("web")
    await eventually(lambda: converged(replica, [src]))
    replica._flush()
    statements: list[str] = []
    replica.store.conn.set_trace_callback(statements.append)
    commits = replica.store.commits
    heard = replica.owners["w1"].heard
    await asyncio.sleep(0.6)  # silent past `unreachable_after`
    assert not replica.reachable("w1") and replica.placeable("mad") == []
    for _ in range(3):
        await owner.heartbeat()
    await eventually(lambda: replica.owners["w1"].heard > heard)
    replica._flush()
    assert statements == [] and replica.store.commits == commits
    assert replica.reachable("w1")
    assert [w.id for w in replica.placeable("mad")] == ["w1"]  # placeable again at once
    src.machine("api")  # news: written
    await eventually(lambda: converged(replica, [src]))
    replica._flush()
    assert any("INSERT" in s for s in statements)
    await owner.stop()
    await replica.stop()


async def test_held_rows_and_repeated_heartbeats_leave_the_collector_nothing_new() -> None:
    bus = InProcessBus()
    replica = Replica(bus)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src, beat=60)
    web = src.machine("web")
    src.put("machines", web.key, (web.row or {}) | {"ports": [8080], "standby_for": ["m0"]})
    await eventually(lambda: converged(replica, [src]))
    await owner.heartbeat()
    await eventually(lambda: replica.owners["w1"].apps == ["web"])
    apps, heard = replica.owners["w1"].apps, replica.owners["w1"].heard
    for _ in range(3):
        await owner.heartbeat()
    await eventually(lambda: replica.owners["w1"].heard > heard)
    assert replica.owners["w1"].apps is apps  # the same apps: the held list is kept

    gc.collect()  # a tuple of strings or numbers is left untracked by its first collection
    machine, worker = replica.machine(web.key), replica.worker("w1")
    assert machine is not None and worker is not None
    assert machine.ports == (8080,) and machine.standby_for == ("m0",)
    held = [machine.ports, machine.standby_for, worker.cpu_kinds]
    assert not any(gc.is_tracked(seq) for seq in held)
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
    assert w1.cpus_reserved == 5 and w1 is replica._workers["w1"]  # the row as now held

    late = SimRows("w3", "mad")
    owners.append(await start_owner(bus, late, beat=0.1))
    await eventually(lambda: "w3" in {w.id for w in replica.placeable("mad")})

    sources[0].put("workers", "w0", None)  # the worker row deleted
    await eventually(lambda: "w0" not in {w.id for w in replica.placeable("mad")})

    await owners[2].stop()  # w2 falls silent
    await eventually(lambda: {w.id for w in replica.placeable("mad")} == {"w1", "w3"})
    assert [w.id for w in replica.silent("mad")] == ["w2"]
    assert replica.silent("mad")[0].unreachable
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

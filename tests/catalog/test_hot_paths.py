"""What keeps a replica cheap at scale: a heartbeat without news writes nothing, the rows it
churns leave the garbage collector little to walk (the placeable rows placement reads, kept
between reads, are the workers index's: test_indexes.py)."""

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

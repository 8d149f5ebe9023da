"""Property: whatever the bus drops, duplicates or reorders, every replica ends up holding exactly
the owners' rows once the bus heals and heartbeats flow."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from souk.catalog.bus import Faults, InProcessBus
from souk.catalog.replica import Replica
from souk.catalog.sim import SimRows
from tests.support.catalog import converged, start_owner
from tests.support.waiting import eventually

op = st.tuples(
    st.integers(0, 2),  # owner
    st.sampled_from(["create", "stop", "destroy", "delete"]),
    st.integers(0, 5),  # machine slot
)
faults = st.builds(
    Faults,
    drop=st.floats(0, 0.6),
    duplicate=st.floats(0, 0.5),
    reorder=st.floats(0, 0.5),
    seed=st.integers(0, 2**16),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=40), faults=faults, replicas=st.integers(1, 3))
def test_replicas_converge_under_faults(
    ops: list[tuple[int, str, int]], faults: Faults, replicas: int
) -> None:
    asyncio.run(_scenario(ops, faults, replicas))


async def _scenario(ops: list[tuple[int, str, int]], faults: Faults, n: int) -> None:
    bus = InProcessBus(faults)
    views = [Replica(bus, pull_timeout=0.2) for _ in range(n)]
    for view in views:
        await view.start(bootstrap=False)
    sources = [SimRows(f"w{i}", ["mad", "ams"][i % 2]) for i in range(3)]
    owners = [await start_owner(bus, s, beat=0.02) for s in sources]
    for who, action, slot in ops:
        src = sources[who]
        key = f"{src.owner}-{slot}"
        if action == "delete":
            src.put("machines", key, None)
        else:
            state = {"create": "started", "stop": "stopped", "destroy": "destroyed"}[action]
            src.machine("web", state=state, key=key)
        if slot % 2:
            await asyncio.sleep(0)
    bus.faults = Faults()  # the network heals
    try:
        await eventually(lambda: all(converged(v, sources) for v in views), timeout=15)
        live = {
            f"{s.owner}-{slot}"
            for s in sources
            for slot in range(6)
            if (c := s.rows.get(("machines", f"{s.owner}-{slot}"))) is not None
            and c.row is not None
            and c.row["state"] != "destroyed"
        }
        for view in views:
            assert {m.id for m in view.machines() if m.state != "destroyed"} == live
    finally:
        for o in owners:
            await o.stop()
        for view in views:
            await view.stop()
        await bus.close()

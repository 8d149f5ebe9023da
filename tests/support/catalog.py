"""Owners and replicas on an in-process bus: starting an owner over simulated rows, and telling
when a replica holds exactly what its owners have."""

from __future__ import annotations

from souk.catalog.bus import Bus
from souk.catalog.owner import Owner
from souk.catalog.replica import Replica
from souk.catalog.signing import Signer
from souk.catalog.sim import SimRows

BEAT = 0.05


def converged(replica: Replica, owners: list[SimRows]) -> bool:
    for src in owners:
        if replica.head(src.owner) != src.seq:
            return False
        for (table, key), (seq, row) in src.live().items():
            if replica.versions.get((src.owner, table, key)) != seq:
                return False
            model = replica.row(src.owner, table, key)
            held = None if model is None else model.model_dump(mode="json")
            if held != row:
                return False
    return True


async def start_owner(
    bus: Bus, src: SimRows, beat: float = BEAT, signer: Signer | None = None
) -> Owner:
    owner = Owner(bus, src, heartbeat_every=beat, signer=signer)
    src.publisher = owner
    await owner.start()
    return owner

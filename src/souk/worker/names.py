"""The worker's `.internal` DNS (`souk.network.dns`), answered to its machines from a replica of
the catalog that the worker follows beside the rows it owns (docs/network.md, "Names")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from souk.catalog.bus import Bus
from souk.catalog.replica import Replica
from souk.catalog.trust import Trust
from souk.network import dns
from souk.worker.addresses import isolated
from souk.worker.oci import network
from souk.worker.settings import WorkerSettings

CATCH_UP = 5.0  # seconds at most for the replica to catch up before the DNS answers anyway


@contextlib.asynccontextmanager
async def answering(
    settings: WorkerSettings, bus: Bus, trust: Trust | None = None, port: int = 53
) -> AsyncIterator[asyncio.Future[Replica] | None]:
    """A replica following `bus` and the DNS over it, on the resolver's address, both made in
    the background (the worker serves at once); the DNS answers once the replica has caught up
    (a question before that is refused by the port, not answered from a partial catalog). None
    (and no DNS) on a worker whose machines share the host's network."""
    if not isolated():
        yield None
        return
    await asyncio.to_thread(network.add_resolver, settings.private_prefix)
    replica = Replica(bus, ":memory:", None, trust=trust)
    closing: list[Callable[[], None]] = []

    async def start() -> Replica:
        await replica.start()
        await replica.caught_up(CATCH_UP)
        names = dns.Names(replica, settings.region, settings.private_prefix)
        address = network.resolver(settings.private_prefix)
        closing.append(await dns.serve(names, address, port, upstream=dns.host_resolver()))
        return replica

    started = asyncio.ensure_future(start())
    try:
        yield started
    finally:
        for close in closing:
            close()
        started.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await started
        await replica.stop()

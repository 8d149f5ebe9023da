"""The worker's `.internal` DNS (`souk.network.dns`), answered to its machines from a replica of
the catalog that the worker follows beside the rows it owns, and its place on the mesh
(`souk.network.mesh`), whose peers it sets from that replica (docs/network.md)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable

from souk.catalog.bus import Bus
from souk.catalog.owner import Owner
from souk.catalog.replica import Replica
from souk.catalog.trust import Trust
from souk.models.catalog import MeshPeer
from souk.network import dns, firewall, mesh, services
from souk.worker.engine import Engine
from souk.worker.machines.addresses import isolated
from souk.worker.oci import network
from souk.worker.rows import WorkerRows
from souk.worker.settings import WorkerSettings

CATCH_UP = 5.0  # seconds at most for the replica to catch up before the DNS answers anyway


@contextlib.asynccontextmanager
async def answering(
    settings: WorkerSettings, bus: Bus, trust: Trust | None = None, port: int = 53
) -> AsyncIterator[asyncio.Future[Replica] | None]:
    """A replica following `bus`, the DNS over it on the resolver's address, and the service
    ports of the worker's machines kept in the firewall from it, all made in
    the background (the worker serves at once); the DNS answers once the replica has caught up
    (a question before that is refused by the port, not answered from a partial catalog). None
    (and no DNS) on a worker whose machines share the host's network."""
    if not isolated():
        yield None
        return
    await asyncio.to_thread(network.add_resolver, settings.private_prefix)
    cluster = ipaddress.IPv6Network(settings.private_prefix, strict=False)
    resolver = network.resolver(settings.private_prefix)
    # the table before the service ports it holds: a machine's row comes before its start
    await asyncio.to_thread(firewall.ensure, cluster, resolver)
    replica = Replica(bus, ":memory:", None, trust=trust)
    closing: list[Callable[[], object]] = []

    async def start() -> Replica:
        await replica.start()
        await replica.caught_up(CATCH_UP)
        names = dns.Names(replica, settings.region, settings.private_prefix)
        closing.append(await dns.serve(names, resolver, port, upstream=dns.host_resolver()))
        ports = services.follow(settings.name, settings.private_prefix, replica)
        closing.append(asyncio.ensure_future(ports).cancel)  # what hosts reach of its machines
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


async def joined(settings: WorkerSettings) -> mesh.Mesh | None:
    """This node on the mesh, its interface up (None without `mesh_port`, or on a worker whose
    machines share the host's network)."""
    if settings.mesh_port is None or not isolated():
        return None
    endpoint = settings.mesh_endpoint
    if endpoint is None:
        raise mesh.MeshError("a mesh port needs the endpoint others reach it at (host:port)")
    node = mesh.Mesh(
        settings.name,
        settings.private_prefix,
        settings.data_dir / mesh.KEY_FILE,
        settings.mesh_port,
        endpoint,
    )
    await asyncio.to_thread(node.start)
    return node


def said_in_row(engine: Engine, owner: Owner) -> Callable[[MeshPeer], Awaitable[None]]:
    """How the worker says its place on the mesh anew (its key rotated, or its start): its row
    names it from a commit of its own, the worker's `mesh` entry in its log (a row's version is
    a commit's sequence: a replica takes no other row at the version it holds)."""

    async def said(peer: MeshPeer) -> None:
        if isinstance(owner.source, WorkerRows):
            owner.source.mesh = peer
        entry = peer.model_dump()
        await engine.store.write(
            lambda tx: tx.log("worker", engine.settings.name, "mesh", "key", data=entry)
        )

    return said


@contextlib.asynccontextmanager
async def meshed(
    node: mesh.Mesh,
    replica: asyncio.Future[Replica],
    bus: Bus,
    said: Callable[[MeshPeer], Awaitable[None]],
) -> AsyncIterator[None]:
    """The node's peers set from the replica once it has caught up (and the proxies' hosts
    that announce themselves on the bus), and kept so; its key followed (`souk mesh rotate`),
    and its place said (`said`) at once, as the key may have changed while it was stopped."""
    announced = mesh.Announced(node.cluster)
    sub = await announced.listen(bus)
    await said(node.peer)

    async def follow() -> None:
        await mesh.follow(node, await asyncio.shield(replica), announced)

    tasks = [asyncio.ensure_future(follow()), asyncio.ensure_future(mesh.keep_key(node, said))]
    try:
        yield
    finally:
        await sub.unsubscribe()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

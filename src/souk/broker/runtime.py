"""Running a broker (`souk broker`), with a catalog replica or a static list of workers.

Given its node files, the broker is a node of a secured cluster on the catalog's side too: it
reaches the bus with its certificate, its replica applies only rows their owners signed (checked
against the cluster CA), and the app registry it may host signs its rows with the broker's key."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvloop

from souk import heap
from souk.broker.fleet import CatalogFleet, Fleet, StaticFleet
from souk.broker.metrics import BrokerMetrics
from souk.broker.placement.pipeline import DEFAULT_DEADLINE, Placer
from souk.broker.placement.policies import policy_named
from souk.broker.placement.reservation import placing_client
from souk.broker.registry import AppRegistry
from souk.broker.server import make_app
from souk.broker.state import Broker
from souk.catalog import http as catalog_http
from souk.catalog import node
from souk.catalog.bus import Bus
from souk.catalog.connecting import ConnectingBus
from souk.catalog.metrics import watch_replica
from souk.catalog.owner import Owner
from souk.catalog.protocol import HELLO
from souk.catalog.replica import following
from souk.catalog.signing import Signer
from souk.clients.workers import WorkerClient
from souk.node.periodic import every
from souk.node.signals import until_signalled
from souk.node.site import served
from souk.pki import NodeFiles
from souk.web import Route
from souk.web.listener import DEFAULT_LIMITS, Limits
from souk.web.tls import ServerCert

T = TypeVar("T")
log = logging.getLogger("souk.broker")
REFRESH_EVERY = 0.5
CONNECT_GRACE = 0.5  # how long a start waits for NATS before serving without it


@dataclass(frozen=True, kw_only=True)
class BrokerSettings:
    host: str
    port: int
    secret: bytes
    workers: list[str]
    registry_dir: Path | None = None
    registry_url: str | None = None
    deadline: float = DEFAULT_DEADLINE
    policy: str = "default"
    nats: str | None = None  # follow the catalog over NATS instead of polling `workers`
    catalog_dir: Path | None = None  # where the replica keeps its SQLite copy
    # The broker's node files: it reaches workers over mutual TLS, and only over it; its bus
    # connection shows them, its replica trusts their CA only, its registry signs with them.
    tls: NodeFiles | None = None
    listener: ServerCert | None = None  # serve the Machines API over HTTPS
    metrics: bool = True  # False: placement records no metrics (benchmarks measure the cost)
    default_region: str | None = None  # for creates that name none (else: every region's best)
    limits: Limits = DEFAULT_LIMITS  # of its listener
    reserve_over_bus: bool = False  # reservations on the bus first (`Reserver`), HTTP after


@contextlib.asynccontextmanager
async def broker_site(opts: BrokerSettings, bus: Bus | None = None) -> AsyncIterator[str]:
    """A running broker; yields its base URL. With a bus (or `opts.nats`), its fleet is a catalog
    replica, signed when `opts.tls` is given; without, a `StaticFleet` polling `opts.workers`."""
    async with contextlib.AsyncExitStack() as stack:
        client = WorkerClient(tls=opts.tls)
        registry = AppRegistry(opts.registry_dir / "apps.db") if opts.registry_dir else None
        if registry is not None:
            stack.callback(registry.close)
        fleet: Fleet
        metrics = BrokerMetrics(opts.metrics)
        extra: list[Route] = []
        before_place = None
        up = True  # whether the bus is connected now
        on_bus = bus is not None or bool(opts.nats)
        key = node.NodeKey(opts.tls) if opts.tls is not None and on_bus else None
        if key is not None:
            await stack.enter_async_context(node.renewing(key))
        if bus is None and opts.nats:
            connect = node.connector(opts.nats, "souk-broker", opts.tls, key)
            nats_bus = await _connecting(connect, f"NATS {opts.nats}")
            stack.push_async_callback(nats_bus.close)
            up, bus = nats_bus.bus is not None, nats_bus
        if bus is not None:
            path = opts.catalog_dir / "catalog.db" if opts.catalog_dir else ":memory:"
            trust = node.ca_trust(opts.tls) if opts.tls is not None else None
            # With NATS down, serve at once: the replica learns the workers from their
            # heartbeats once it connects, with no snapshot to wait for now.
            replica = await stack.enter_async_context(
                following(
                    bus,
                    path,
                    bootstrap=opts.nats is not None and up,
                    settle=2.0 if up else 0.0,
                    trust=trust,
                )
            )
            fleet = CatalogFleet(replica, registry)
            watch_replica(metrics.metrics, replica)
            extra = catalog_http.routes(replica)
            if registry is not None:
                await stack.enter_async_context(registry_owner(bus, registry, key))
        else:
            apps = registry if registry is not None else AppRegistry()
            static = StaticFleet(opts.workers, apps, client)
            await static.refresh()
            refresher = asyncio.create_task(
                every(REFRESH_EVERY, static.refresh, what="fleet refresh", log=log)
            )
            stack.callback(refresher.cancel)
            fleet = static

            async def before_place() -> None:
                await static.refresh(machines=False)

        placing = placing_client(opts.tls)
        placer = Placer(
            fleet,
            placing,
            policy_named(opts.policy),
            opts.deadline,
            bus=bus,
            metrics=metrics,
            reserve_over_bus=opts.reserve_over_bus,
        )
        broker = Broker(
            fleet,
            client,
            placer,
            registry,
            opts.registry_url,
            before_place,
            default_region=opts.default_region,
        )
        ctx = opts.listener.context() if opts.listener is not None else None
        app = make_app(broker, opts.secret, extra)
        yield await stack.enter_async_context(
            served(app, opts.host, opts.port, ssl_context=ctx, limits=opts.limits)
        )


async def _connecting(connect: Callable[[], Awaitable[Bus]], where: str) -> ConnectingBus:
    """NATS connected in the background; waits a moment for it, so that a start with NATS up
    bootstraps its replica as before."""
    bus = ConnectingBus(connect, where)
    bus.on_connect(lambda: bus.publish(HELLO, b"{}"))  # owners answer with a heartbeat
    bus.start()
    await bus.wait_connected(CONNECT_GRACE)
    return bus


@contextlib.asynccontextmanager
async def registry_owner(
    bus: Bus, registry: AppRegistry, signer: Signer | None = None
) -> AsyncIterator[Owner]:
    """The registry as the owner of the catalog's apps rows, signed by its broker's key on a
    signed catalog (any broker's certificate may sign them)."""
    owner = Owner(bus, registry, signer=signer)
    registry.listeners.append(owner.committed)
    await owner.start()
    try:
        yield owner
    finally:
        registry.listeners.remove(owner.committed)
        await owner.stop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Runs a broker's coroutine on uvloop: a secured broker reads every request, reservation,
    catalog batch and heartbeat through TLS, whose transport asyncio writes in Python and
    uvloop compiles (9% less broker CPU per create secured, measured; docs/benchmarks.md)."""
    return uvloop.run(main)


async def serve(opts: BrokerSettings) -> None:
    async with broker_site(opts) as url:
        heap.settle()
        print(f"souk broker ready on {url}", flush=True)
        await until_signalled()

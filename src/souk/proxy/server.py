"""Assembling the proxy: its parts, its HTTP server, and where its catalog comes from.

The proxy holds no state of record. What it knows of the fleet comes from a catalog replica
(`CatalogView`), what it changes goes through the broker's public API; requests in flight,
recent starts and stops and the service settings it read are all it keeps, in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from souk import heap
from souk.catalog import node
from souk.catalog.bus import Bus
from souk.catalog.metrics import watch_replica
from souk.catalog.replica import Replica, following
from souk.catalog.view import CatalogView
from souk.clients.machines import MachinesClient
from souk.clients.workers import WorkerClient
from souk.models.catalog import MeshPeer
from souk.models.wire import DEFAULT_PRIVATE_PREFIX
from souk.network import mesh
from souk.node.signals import until_signalled
from souk.node.site import served
from souk.pki import NodeFiles
from souk.proxy.forward import Forwarder, app_header, make_session
from souk.proxy.holders import Holders
from souk.proxy.idle import Autostop, stop_task
from souk.proxy.metrics import ProxyMetrics
from souk.proxy.own import OwnRoutes, own_routes
from souk.proxy.policy import Policies
from souk.proxy.routing import Loads, Marks, Router, app_of
from souk.proxy.wake import Waker
from souk.web.errors import json_error
from souk.web.listener import DEFAULT_LIMITS, Limits
from souk.web.tls import ServerCert

log = logging.getLogger("souk.proxy")


@dataclass(frozen=True, kw_only=True)
class ProxySettings:
    host: str = "127.0.0.1"
    port: int = 4300
    api: str = "http://127.0.0.1:4280"
    token: str = ""
    domain: str = "souk.local"
    region: str | None = None
    idle_timeout: float = 60.0
    start_timeout: float = 10.0
    autostop: bool = True
    nats: str | None = None
    catalog_dir: Path | None = None
    ca: Path | None = None  # the CA an https broker's certificate is checked against
    listener: ServerCert | None = None  # serve HTTPS
    # The proxy's node files: its bus connection shows them, its replica trusts their CA only.
    tls: NodeFiles | None = None
    metrics: bool = True  # False: requests record no metrics (benchmarks measure the cost)
    # False: send to whatever listens at a machine's address, unchecked (only for backends no
    # worker runs, as in tests over a hand-written catalog). See `souk.proxy.holders`.
    check_sockets: bool = True
    # On the private network's mesh (docs/network.md): its UDP port, the host:port other hosts
    # reach it at, where its key is kept, its name there, and the cluster's /48.
    mesh_port: int | None = None
    mesh_endpoint: str | None = None
    mesh_dir: Path | None = None
    mesh_name: str = "proxy"
    private_prefix: str = DEFAULT_PRIVATE_PREFIX
    limits: Limits = DEFAULT_LIMITS  # of its listener


class Proxy:
    """Every part of one proxy, wired together over one catalog view and one broker."""

    def __init__(self, view: CatalogView, opts: ProxySettings) -> None:
        self.view = view
        self.opts = opts
        self.broker = MachinesClient(opts.api, opts.token, timeout=30.0, ca=opts.ca)
        self.policies = Policies(self.broker)
        self.loads = Loads()
        self.marks = Marks()
        self.router = Router(view, self.policies, self.loads, self.marks, opts.region)
        self.waker = Waker(self.router, self.broker, opts.start_timeout)
        self.autostop = Autostop(self.router, self.broker, opts.idle_timeout)
        # Workers are asked whether a machine holds the socket at its address (mutual TLS with
        # the proxy's node files, when it has them).
        self.workers = WorkerClient(tls=opts.tls)
        self.holders = Holders(view, self.workers) if opts.check_sockets else None
        self.session = make_session(self.holders)
        self.forwarder = Forwarder(
            self.router,
            self.waker,
            self.broker,
            self.session,
            opts.domain,
            opts.start_timeout,
        )
        self.metrics = ProxyMetrics(opts.metrics)
        self.forwarder.upstream_seconds = self.metrics.upstream_seconds
        self.waker.metrics = self.autostop.metrics = self.metrics
        self.metrics.watch(self.forwarder.stats, lambda: sum(self.loads.inflight.values()))
        if isinstance(view, Replica):
            watch_replica(self.metrics.metrics, view)
        routes = own_routes(self.status, self.metrics.metrics)
        self.own = OwnRoutes(routes, opts.api, opts.ca)
        self._idle_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.opts.autostop:
            self._idle_task = asyncio.create_task(self.autostop.run())

    async def close(self) -> None:
        await stop_task(self._idle_task)
        await self.waker.close()
        await self.policies.close()
        await self.session.close()
        await self.own.close()
        await self.workers.close()
        await self.broker.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        app = app_of(request.host, app_header(request), self.opts.domain)
        if app is None:
            route = self.own.routes.get(request.path)
            if route is not None:
                return await self.own.handle(request, route)
            return json_error(
                404,
                "app_not_found",
                f"name an app: a Host of <app>.{self.opts.domain}, or a souk-app header",
            )
        began = time.perf_counter()
        response = await self.forwarder.handle(request, app)
        self.metrics.answered(response.status, time.perf_counter() - began)
        return response

    def status(self) -> dict[str, Any]:
        return {
            "region": self.opts.region,
            "domain": self.opts.domain,
            "machines_known": len(self.view.machines()),  # in its catalog replica, any state
            "inflight": dict(self.loads.inflight),
            "starts": self.waker.starts,
            "stopped": len(self.autostop.stopped),
            **self.forwarder.stats,
        }


def make_app(proxy: Proxy) -> web.Application:
    app = web.Application(handler_args={"max_field_size": 32 * 1024})
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    return app


@contextlib.asynccontextmanager
async def proxy_site(view: CatalogView, opts: ProxySettings) -> AsyncIterator[tuple[Proxy, str]]:
    """A running proxy over this view; yields it and its base URL."""
    proxy = Proxy(view, opts)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(proxy.close)
        await proxy.start()
        ctx = opts.listener.context() if opts.listener is not None else None
        site = served(make_app(proxy), opts.host, opts.port, ssl_context=ctx, limits=opts.limits)
        yield proxy, await stack.enter_async_context(site)


@contextlib.asynccontextmanager
async def on_the_mesh(opts: ProxySettings, bus: Bus, view: CatalogView) -> AsyncIterator[None]:
    """This host on the mesh: every worker a peer (from the catalog), and itself announced on
    the bus for the workers to take as theirs, so that it reaches machines on any host."""
    if opts.mesh_endpoint is None or opts.mesh_dir is None or opts.mesh_port is None:
        raise ValueError("the mesh needs --mesh-port, --mesh-endpoint and --mesh-dir")
    opts.mesh_dir.mkdir(parents=True, exist_ok=True)
    node = mesh.Mesh(
        opts.mesh_name,
        opts.private_prefix,
        opts.mesh_dir / mesh.KEY_FILE,
        opts.mesh_port,
        opts.mesh_endpoint,
    )
    await asyncio.to_thread(node.start)
    again = asyncio.Event()  # its key rotated (`souk mesh rotate`): announced at once

    async def rotated(_: MeshPeer) -> None:
        again.set()

    tasks = [
        asyncio.ensure_future(mesh.follow(node, view)),
        asyncio.ensure_future(mesh.announce(bus, node, again)),
        asyncio.ensure_future(mesh.keep_key(node, rotated)),
    ]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def serve(opts: ProxySettings) -> None:
    """`souk proxy`: a replica following NATS (signed, given node files), and the proxy over it,
    until a signal."""
    if not opts.nats:
        raise ValueError("souk proxy needs a catalog: --nats")
    async with contextlib.AsyncExitStack() as stack:
        bus = await stack.enter_async_context(node.joined(opts.nats, "souk-proxy", opts.tls))
        path: Path | str = ":memory:"
        if opts.catalog_dir is not None:
            opts.catalog_dir.mkdir(parents=True, exist_ok=True)
            path = opts.catalog_dir / "catalog.db"
        trust = node.ca_trust(opts.tls) if opts.tls is not None else None
        replica = await stack.enter_async_context(following(bus, path, trust=trust))
        if opts.mesh_port is not None:
            await stack.enter_async_context(on_the_mesh(opts, bus, replica))
        _, url = await stack.enter_async_context(proxy_site(replica, opts))
        heap.settle()
        print(f"souk proxy ready on {url} (apps at <app>.{opts.domain})", flush=True)
        await until_signalled()

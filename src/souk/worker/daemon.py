"""Wires a worker together: its engine, its driver and its HTTP server.

Given its node files, the server speaks mutual TLS only, and each route answers the roles it
declares (`souk.worker.http`), by the certificate the caller showed; the bus is reached with the
same certificate, and every row the worker publishes is signed with its key. Without them, plain
HTTP to anyone and unsigned rows on an open bus (`souk worker` allows that only on loopback, or
with --insecure)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sqlite3
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from souk import heap
from souk.catalog import node
from souk.catalog.bus import Bus, Message
from souk.catalog.connecting import ConnectingBus
from souk.catalog.owner import Owner
from souk.catalog.signing import Signer
from souk.models.capacity import OfferCall, offers_subject
from souk.models.catalog import MeshPeer
from souk.node.signals import until_signalled
from souk.node.site import served
from souk.pki import NodeFiles, reloading_server_context, role_middleware
from souk.web import error_middleware
from souk.web.body import MAX_BODY_BYTES
from souk.web.listener import DEFAULT_LIMITS, Limits
from souk.web.protocol import protocol_middleware
from souk.worker import http, names, schedules
from souk.worker.drivers import vm_boot
from souk.worker.drivers.base import Drivers
from souk.worker.drivers.process import ProcessDriver
from souk.worker.drivers.runc import RuncDriver
from souk.worker.drivers.sim import SimDriver
from souk.worker.drivers.vm import VmDriver, VmError
from souk.worker.engine import Engine
from souk.worker.host import logs
from souk.worker.host.cgroups import Cgroups, worker_group
from souk.worker.http.state import FENCES
from souk.worker.inherited_signals import catch_ignored
from souk.worker.oci.images import ImageCache
from souk.worker.oci.registry import RegistryClient, RegistryConfig
from souk.worker.reserving import reserving
from souk.worker.rows import WorkerRows
from souk.worker.settings import WorkerSettings
from souk.worker.state.storage import check_data_dir, unusable

log = logging.getLogger("souk.worker")


def make_driver(name: str, settings: WorkerSettings) -> Drivers:
    """`process`: host commands, and images through runc where the host can run it (root and
    runc present); `vm`: host commands, and images as qemu guests (root and qemu present);
    `sim`: runs nothing, for benchmarks."""
    if name == "sim":
        sim = SimDriver()
        return Drivers(command=sim, image=sim)
    if name not in ("process", "vm"):
        raise ValueError(f"unknown driver {name!r}: process, vm or sim")
    drivers = Drivers(command=ProcessDriver(Cgroups(worker_group(settings.name))))
    if name == "vm":
        return _with_vms(drivers, settings)
    if os.geteuid() == 0 and shutil.which("runc"):
        images = _image_cache(settings)
        drivers.images = images
        drivers.image = RuncDriver(
            images, settings.data_dir / "runc", cgroup_parent=worker_group(settings.name)
        )
    return drivers


def _image_cache(settings: WorkerSettings) -> ImageCache:
    return ImageCache(
        settings.data_dir / "images",
        RegistryClient(
            RegistryConfig(
                insecure=frozenset(settings.insecure_registries),
                private=frozenset(settings.private_registries),
            )
        ),
        budget=settings.image_cache_mb << 20 if settings.image_cache_mb else None,
    )


def _with_vms(drivers: Drivers, settings: WorkerSettings) -> Drivers:
    """Image machines as guests: what accelerates them is probed once, at start, and shown in
    the worker's capacity (`vm`)."""
    drivers.vm = vm_boot.probe_accel()
    if os.geteuid() != 0:
        raise VmError("the vm driver runs as root (it makes network namespaces and cgroups)")
    drivers.images = _image_cache(settings)
    drivers.image = VmDriver(drivers.images, Cgroups(worker_group(settings.name)), drivers.vm)
    return drivers


def make_app(engine: Engine, secure: bool = False) -> web.Application:
    """`secure`: for a TLS listener that verifies client certificates; every route then
    answers only the roles its route declares (401 without a certificate, 403 another role)."""
    checks = [role_middleware()] if secure else []
    middlewares = [*checks, protocol_middleware, error_middleware]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    http.serve(app, engine)
    return app


def tls_context(files: NodeFiles) -> ssl.SSLContext:
    """The worker's listener: its certificate, renewed from disk without a restart; a client
    may show no certificate (and is answered 401, as JSON), but one the cluster CA did not issue,
    or an expired one, fails the handshake."""
    return reloading_server_context(files, require_client_cert=False)


@contextlib.asynccontextmanager
async def running(engine: Engine) -> AsyncIterator[Engine]:
    """Recover, then keep the background chores going while the worker runs."""
    catch_ignored()  # before any machine starts: they inherit nothing the worker's start ignored
    await engine.recover()
    rotator = asyncio.create_task(
        logs.rotate_forever(engine.settings.data_dir / "machines", engine.settings.log_max_bytes)
    )
    scheduler = asyncio.create_task(schedules.schedule_forever(engine))
    try:
        yield engine
    finally:
        rotator.cancel()
        scheduler.cancel()
        await engine.close()


@contextlib.asynccontextmanager
async def publishing(
    engine: Engine,
    bus: Bus,
    address: str | None = None,
    signer: Signer | None = None,
    mesh: MeshPeer | None = None,
) -> AsyncIterator[Owner]:
    """The worker as the owner of its catalog rows: each commit published as it lands, signed
    with its node key when given one (a signed catalog takes no other); its row says where it
    is on the mesh, if it is."""
    rows = WorkerRows(engine, address or engine.settings.address)
    rows.mesh = mesh
    owner = Owner(bus, rows, signer=signer)
    rows.attach(owner)
    await owner.start()
    try:
        yield owner
    finally:
        rows.detach()
        await owner.stop()


@contextlib.asynccontextmanager
async def offering(engine: Engine, bus: Bus) -> AsyncIterator[None]:
    """Answer the region's offer calls on the bus: one message from a broker reaches every
    worker of the region, instead of one HTTP request to each."""
    me = engine.settings.name

    async def on_call(msg: Message) -> None:
        if not msg.reply:
            return
        try:
            call = OfferCall.model_validate_json(msg.data)
        except ValueError:
            return
        if me in call.workers:
            await bus.publish(msg.reply, engine.offer(call.request).model_dump_json().encode())

    sub = await bus.subscribe(offers_subject(engine.settings.region), on_call)
    try:
        yield
    finally:
        await sub.unsubscribe()


def open_engine(settings: WorkerSettings, driver_name: str) -> Engine:
    """The engine on its data directory; `DataDirUnusable` (one line) when that cannot be
    created, written or opened."""
    check_data_dir(settings.data_dir)
    try:
        return Engine(settings, make_driver(driver_name, settings))
    except (OSError, sqlite3.Error) as exc:
        raise unusable(settings.data_dir, exc) from exc


async def serve(
    settings: WorkerSettings,
    driver_name: str,
    host: str,
    port: int,
    nats: str | None = None,
    tls: NodeFiles | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> None:
    engine = open_engine(settings, driver_name)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running(engine))
        app = make_app(engine, secure=tls is not None)
        fences = app[FENCES]  # the HTTP route's and the bus's reservations share it
        if nats:
            # Serve first, join the catalog whenever NATS answers: the owner's rows wait in the
            # database, and its first heartbeat on connecting tells the replicas to pull them.
            # With node files, the bus sees its certificate and every row is signed by its key.
            key = node.NodeKey(tls) if tls is not None else None
            if key is not None:
                await stack.enter_async_context(node.renewing(key))
            connect = node.connector(nats, f"souk-worker-{settings.name}", tls, key)
            bus = ConnectingBus(connect, f"NATS {nats}")
            stack.push_async_callback(bus.close)
            mesh = await names.joined(settings)
            peer = mesh.peer if mesh is not None else None
            owner = await stack.enter_async_context(publishing(engine, bus, None, key, peer))
            await stack.enter_async_context(offering(engine, bus))
            await stack.enter_async_context(reserving(engine, fences, bus, tls is not None))
            trust = node.ca_trust(tls) if tls is not None else None
            replica = await stack.enter_async_context(names.answering(settings, bus, trust))
            if mesh is not None and replica is not None:
                said = names.said_in_row(engine, owner)
                await stack.enter_async_context(names.meshed(mesh, replica, bus, said))
            bus.on_connect(owner.heartbeat)
            engine.bus_link = bus
            bus.start()
        ctx = tls_context(tls) if tls is not None else None
        async with served(app, host, port, ssl_context=ctx, limits=limits) as url:
            log.info("worker %s (%s) listening on %s", settings.name, settings.region, url)
            heap.settle()
            print(f"souk worker {settings.name} ready on {url}", flush=True)
            await until_signalled()

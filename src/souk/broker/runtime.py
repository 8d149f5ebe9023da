"""Running a broker: on its own (`souk broker`) or with a whole cluster in one process
(`souk dev`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from souk.broker.api import Broker
from souk.broker.fleet import CatalogFleet, Fleet, StaticFleet
from souk.broker.placement import policy_named
from souk.broker.placer import DEFAULT_DEADLINE, Placer
from souk.broker.registry import AppRegistry
from souk.broker.server import make_app
from souk.broker.tokens import mint, new_secret, read_secret
from souk.broker.workers import WorkerClient
from souk.catalog import http as catalog_http
from souk.catalog.bus import Bus, InProcessBus, NatsBus
from souk.catalog.owner import Owner
from souk.catalog.replica import following
from souk.web import Route
from souk.worker.daemon import make_app as make_worker_app
from souk.worker.daemon import make_driver, offering, publishing, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings

log = logging.getLogger("souk.broker")
REFRESH_EVERY = 0.5


@dataclass(frozen=True)
class BrokerOptions:
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


async def _refresh_forever(fleet: StaticFleet) -> None:
    while True:
        await asyncio.sleep(REFRESH_EVERY)
        try:
            await fleet.refresh()
        except Exception:  # a refresh must never take the broker down
            log.exception("fleet refresh failed")


@contextlib.asynccontextmanager
async def broker_site(opts: BrokerOptions, bus: Bus | None = None) -> AsyncIterator[str]:
    """A running broker; yields its base URL. With a bus (or `opts.nats`), its fleet is a catalog
    replica; without, a `StaticFleet` polling `opts.workers`."""
    async with contextlib.AsyncExitStack() as stack:
        client = WorkerClient()
        registry = AppRegistry(opts.registry_dir / "apps.db") if opts.registry_dir else None
        if registry is not None:
            stack.callback(registry.close)
        fleet: Fleet
        extra: list[Route] = []
        before_place = None
        if bus is None and opts.nats:
            bus = await NatsBus.connect(opts.nats, name="souk-broker")
            stack.push_async_callback(bus.close)
        if bus is not None:
            path = opts.catalog_dir / "catalog.db" if opts.catalog_dir else ":memory:"
            replica = await stack.enter_async_context(
                following(bus, path, bootstrap=opts.nats is not None)
            )
            fleet = CatalogFleet(replica, registry)
            extra = catalog_http.routes(replica)
            if registry is not None:
                await stack.enter_async_context(registry_owner(bus, registry))
        else:
            apps = registry if registry is not None else AppRegistry()
            static = StaticFleet(opts.workers, apps, client)
            await static.refresh()
            refresher = asyncio.create_task(_refresh_forever(static))
            stack.callback(refresher.cancel)
            fleet = static

            async def before_place() -> None:
                await static.refresh(machines=False)

        placer = Placer(fleet, client, policy_named(opts.policy), opts.deadline, bus=bus)
        broker = Broker(fleet, client, placer, registry, opts.registry_url, before_place)
        runner = web.AppRunner(make_app(broker, opts.secret, extra), access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, opts.host, opts.port, backlog=1024)
        await site.start()
        yield f"http://{opts.host}:{runner.addresses[0][1]}"


@contextlib.asynccontextmanager
async def registry_owner(bus: Bus, registry: AppRegistry) -> AsyncIterator[Owner]:
    """The registry as the owner of the catalog's apps rows."""
    owner = Owner(bus, registry)
    registry.listeners.append(owner.committed)
    await owner.start()
    try:
        yield owner
    finally:
        registry.listeners.remove(owner.committed)
        await owner.stop()


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(opts: BrokerOptions) -> None:
    async with broker_site(opts) as url:
        print(f"souk broker ready on {url}", flush=True)
        await _until_signalled()


DEV_REGIONS = ("mad", "ams", "sin")


@contextlib.asynccontextmanager
async def dev_cluster(
    data_dir: Path,
    host: str = "127.0.0.1",
    port: int = 4280,
    driver: str = "process",
    cpus: int = 4,
    memory_mb: int = 4096,
) -> AsyncIterator[tuple[str, str]]:
    """Three regions of two workers each, and a broker, in this process. Yields the broker's
    URL and an admin token."""
    data_dir.mkdir(parents=True, exist_ok=True)
    secret_path = data_dir / "secret"
    if not secret_path.exists():
        secret_path.write_bytes(new_secret() + b"\n")
        secret_path.chmod(0o600)
    secret = read_secret(secret_path)
    async with contextlib.AsyncExitStack() as stack:
        bus = InProcessBus()
        stack.push_async_callback(bus.close)
        urls = []
        for region in DEV_REGIONS:
            for n in (1, 2):
                name = f"{region}{n}"
                settings = WorkerSettings(
                    name=name,
                    region=region,
                    data_dir=data_dir / "workers" / name,
                    cpus=cpus,
                    memory_mb=memory_mb,
                    durable=False,
                )
                engine = await stack.enter_async_context(
                    running(Engine(settings, make_driver(driver, settings)))
                )
                runner = web.AppRunner(make_worker_app(engine), access_log=None)
                await runner.setup()
                stack.push_async_callback(runner.cleanup)
                await web.TCPSite(runner, host, 0).start()
                urls.append(f"http://{host}:{runner.addresses[0][1]}")
                await stack.enter_async_context(publishing(engine, bus, urls[-1]))
                await stack.enter_async_context(offering(engine, bus))
        opts = BrokerOptions(host, port, secret, urls, registry_dir=data_dir / "registry")
        url = await stack.enter_async_context(broker_site(opts, bus))
        token = mint(secret, operator=True)
        (data_dir / "token").write_text(token + "\n")
        yield url, token


async def run_dev(data_dir: Path, host: str, port: int, driver: str) -> None:
    async with dev_cluster(data_dir, host, port, driver) as (url, token):
        (data_dir / "api").write_text(url + "\n")
        print(f"souk dev: 3 regions ({', '.join(DEV_REGIONS)}) x 2 workers, broker on {url}")
        print(f"export SOUK_API={url}")
        print(f"export SOUK_TOKEN={token}")
        print(
            "then: souk apps create demo && souk machines run --app demo --region mad -- "
            "python3 -m http.server 8080",
            flush=True,
        )
        await _until_signalled()

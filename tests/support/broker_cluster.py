"""A small real cluster in one process: sim-driver workers behind real loopback HTTP servers, a
broker in front of them, and tokens minted from a test secret."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from souk.broker.fleet import CatalogFleet, Fleet, StaticFleet
from souk.broker.placement.pipeline import Placer
from souk.broker.registry import AppRegistry
from souk.broker.runtime import registry_owner
from souk.broker.server import make_app as make_broker_app
from souk.broker.state import Broker
from souk.broker.tokens import mint
from souk.catalog import http as catalog_http
from souk.catalog.bus import InProcessBus
from souk.catalog.replica import following
from souk.clients.workers import WorkerClient
from souk.models.machine import CpuKind
from souk.web import Route
from souk.worker.daemon import make_app, make_driver, offering, publishing, running
from souk.worker.engine import Engine
from souk.worker.http.state import FENCES
from souk.worker.reserving import reserving
from souk.worker.settings import WorkerSettings
from tests.support.clients import Client
from tests.support.engines import destroy_all

SECRET = b"test-secret-0123456789abcdef"


@dataclass
class WorkerSpec:
    name: str
    region: str
    cpus: int = 4
    memory_mb: int = 4096
    driver: str = "sim"
    disk_mb: int | None = None
    cpu_kinds: tuple[CpuKind, ...] = ("shared",)


@dataclass
class Cluster:
    broker: Client
    fleet: Fleet
    engines: dict[str, Engine]
    urls: dict[str, str]
    placer: Placer
    tokens: dict[str, str] = field(default_factory=dict)

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.tokens['admin']}"}

    async def call(self, method: str, path: str, token: str | None = None, **kw: Any) -> Any:
        headers = {**self.auth(token), **kw.pop("headers", {})}
        return await self.broker.request(method, path, headers=headers, **kw)


@contextlib.asynccontextmanager
async def cluster(
    tmp_path: Path,
    specs: list[WorkerSpec],
    deadline: float = 2.0,
    bus: InProcessBus | None = None,
    reserve_over_bus: bool = False,
) -> AsyncIterator[Cluster]:
    """With a bus, workers publish to the catalog and answer offers on it, and the broker places
    from a replica; without, it polls the workers (`StaticFleet`). `reserve_over_bus`: workers
    take reservations on the bus too, and the broker sends them there."""
    async with contextlib.AsyncExitStack() as stack:
        engines: dict[str, Engine] = {}
        urls: dict[str, str] = {}
        for spec in specs:
            settings = WorkerSettings(
                name=spec.name,
                region=spec.region,
                data_dir=tmp_path / spec.name,
                cpus=spec.cpus,
                memory_mb=spec.memory_mb,
                disk_mb=spec.disk_mb,
                cpu_kinds=spec.cpu_kinds,
                durable=False,
            )
            engine = await stack.enter_async_context(
                running(Engine(settings, make_driver(spec.driver, settings)))
            )
            stack.push_async_callback(destroy_all, engine)  # machines outlive their worker
            server = TestServer(make_app(engine), host="127.0.0.1")
            await stack.enter_async_context(server)
            engines[spec.name] = engine
            urls[spec.name] = str(server.make_url("")).rstrip("/")
            if bus is not None:
                await stack.enter_async_context(publishing(engine, bus, urls[spec.name]))
                await stack.enter_async_context(offering(engine, bus))
                if reserve_over_bus:
                    fences = server.app[FENCES]
                    await stack.enter_async_context(reserving(engine, fences, bus))
        client = WorkerClient()
        registry = AppRegistry(tmp_path / "registry.db")
        fleet: Fleet
        extra: list[Route] = []
        if bus is None:
            static = StaticFleet(list(urls.values()), registry, client)
            await static.refresh()
            fleet, before_place = static, (lambda: static.refresh(machines=False))
        else:  # as `souk broker --nats` with a registry: it serves the catalog, and owns apps
            replica = await stack.enter_async_context(following(bus, bootstrap=False))
            fleet, before_place = CatalogFleet(replica, registry), None
            extra = catalog_http.routes(replica)
            await stack.enter_async_context(registry_owner(bus, registry))
        placer = Placer(
            fleet, client, deadline=deadline, bus=bus, reserve_over_bus=reserve_over_bus
        )
        broker = Broker(fleet, client, placer, registry=registry, before_place=before_place)
        broker_app = make_broker_app(broker, SECRET, extra)
        broker_client = TestClient(TestServer(broker_app, host="127.0.0.1"))
        await stack.enter_async_context(broker_client)
        c = Cluster(broker_client, fleet, engines, urls, placer)
        c.tokens = {
            "admin": mint(SECRET),
            "operator": mint(SECRET, operator=True),
            "demo": mint(SECRET, apps=["demo"]),
            "demo-read": mint(SECRET, apps=["demo"], read_only=True),
            "other": mint(SECRET, apps=["other"]),
        }
        resp = await c.call("POST", "/v1/apps", json={"name": "demo"})
        assert resp.status == 201, await resp.text()
        yield c


ClusterFactory = Callable[..., contextlib.AbstractAsyncContextManager[Cluster]]


def machine_body(
    region: str = "mad", cpus: int = 1, memory_mb: int = 256, **config: Any
) -> dict[str, Any]:
    return {
        "region": region,
        "config": {
            "init": {"exec": ["sleep", "60"]},
            "guest": {"cpus": cpus, "memory_mb": memory_mb},
            **config,
        },
    }
